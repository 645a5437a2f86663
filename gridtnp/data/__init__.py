"""Synthetic task generators and LightningDataModules.

``SyntheticDataModule``, ``Task``, ``sample_path`` (the embedded data), ``StationReanalysisDataModule`` and
``MultiSourceDataModule`` (``gridtnp.data.era5``, with xarray and dask) are imported on first access, so
``gridtnp.data.prepare`` loads without torch and Lightning: they are the public import paths recipes name
(``class_path: gridtnp.data.StationReanalysisDataModule``). Registration is not done here: the registry's first
lookup imports the task and DataModule modules (``gridtnp.import_components``).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "SyntheticDataModule": "gridtnp.data.datamodules",
    "Task": "gridtnp.data.tasks",
    "sample_path": "gridtnp.data.sample",
    "StationReanalysisDataModule": "gridtnp.data.era5.station_reanalysis",
    "MultiSourceDataModule": "gridtnp.data.era5.multisource",
    "ObservationDataModule": "gridtnp.data.observations.datamodule",
}

__all__ = [
    "MultiSourceDataModule",
    "ObservationDataModule",
    "StationReanalysisDataModule",
    "SyntheticDataModule",
    "Task",
    "sample_path",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
