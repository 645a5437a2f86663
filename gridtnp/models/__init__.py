"""Whole models: the five-slot ``NeuralProcess``, its builder and named presets."""

from gridtnp.models import presets  # noqa: F401  (registers the presets)
from gridtnp.models.neural_process import NeuralProcess, count_parameters
from gridtnp.models.specs import build_model, create_model

__all__ = ["NeuralProcess", "build_model", "count_parameters", "create_model"]
