"""Synthetic task generators and LightningDataModules; importing this registers every task.

``SyntheticDataModule``, ``Task``, ``sample_path`` (the embedded data); ``StationReanalysisDataModule`` and
``MultiSourceDataModule`` (``gridtnp.data.era5``) are imported on first access, with xarray and dask.
"""

from typing import Any

from gridtnp.data import gp, gp1d_multimodal, sawtooth  # noqa: F401  (importing registers the tasks)
from gridtnp.data.datamodules import SyntheticDataModule
from gridtnp.data.sample import sample_path
from gridtnp.data.tasks import Task

__all__ = [
    "MultiSourceDataModule",
    "StationReanalysisDataModule",
    "SyntheticDataModule",
    "Task",
    "sample_path",
]


def __getattr__(name: str) -> Any:
    # The ERA5 DataModules need xarray, pandas and dask: imported on first use, not with gridtnp.
    if name == "StationReanalysisDataModule":
        from gridtnp.data.era5.station_reanalysis import StationReanalysisDataModule

        return StationReanalysisDataModule
    if name == "MultiSourceDataModule":
        from gridtnp.data.era5.multisource import MultiSourceDataModule

        return MultiSourceDataModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
