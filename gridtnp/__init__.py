"""gridtnp: gridded transformer neural processes in PyTorch Lightning."""

from gridtnp import data, models, nn  # noqa: F401  (importing registers every component)
from gridtnp.batch import Batch, Observations
from gridtnp.models import NeuralProcess, build_model, count_parameters, create_model
from gridtnp.module import NeuralProcessModule
from gridtnp.registry import ConfigError, available, build, register, unregister

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "ConfigError",
    "NeuralProcess",
    "NeuralProcessModule",
    "Observations",
    "available",
    "build",
    "build_model",
    "count_parameters",
    "create_model",
    "register",
    "unregister",
]
