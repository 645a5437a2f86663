"""gridtnp: gridded transformer neural processes in PyTorch Lightning.

The public names are imported on first use (PEP 562), so what needs only the data tools (``gridtnp data prepare``,
``gridtnp --help``) starts without torch and Lightning. The component packages register what they define when
imported; ``import_components`` imports them, and the registry calls it on its first lookup (``gridtnp.registry``).
"""

from __future__ import annotations

import importlib
from typing import Any

from gridtnp.registry import ConfigError, add_loader, available, build, register, unregister

__version__ = "0.1.0"

_LAZY = {
    "Batch": "gridtnp.batch",
    "Observations": "gridtnp.batch",
    "NeuralProcess": "gridtnp.models",
    "build_model": "gridtnp.models",
    "count_parameters": "gridtnp.models",
    "create_model": "gridtnp.models",
    "NeuralProcessModule": "gridtnp.module",
}
_SUBPACKAGES = {"cli", "data", "inference", "models", "nn", "report", "training"}

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


def import_components() -> None:
    """Import gridtnp's packages of registered components: the model stages, presets, tasks and DataModules."""
    from gridtnp import models, nn  # noqa: F401
    from gridtnp.data import datamodules, era5, synthetic  # noqa: F401
    from gridtnp.data.observations import datamodule  # noqa: F401


add_loader(import_components)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f"gridtnp.{name}")
    raise AttributeError(f"module 'gridtnp' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *_SUBPACKAGES})
