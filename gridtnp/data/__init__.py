"""Batches, synthetic task generators and LightningDataModules; importing this registers every task."""

from gridtnp.data import gp, sawtooth  # noqa: F401  (importing registers the tasks)
from gridtnp.data.batch import DEFAULT_SOURCE, Batch, Observations
from gridtnp.data.datamodules import SyntheticDataModule
from gridtnp.data.sample import sample_path
from gridtnp.data.tasks import Task

__all__ = ["DEFAULT_SOURCE", "Batch", "Observations", "SyntheticDataModule", "Task", "sample_path"]
