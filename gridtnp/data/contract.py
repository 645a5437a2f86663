"""``GridDataModule``: the base of gridtnp's DataModules, and the one statement of what gridtnp reads from one
beyond Lightning's hooks: every hook optional, each with one meaning and a default that switches its feature off.

A DataModule for a new data source needs only Lightning's ``*_dataloader`` methods yielding ``gridtnp.Batch``
objects; deriving from ``GridDataModule`` (or ``gridtnp.data.datamodules.TaskDataModule``, which adds the seeded
loaders) gives every hook below its default. ``OPTIONAL_ATTRIBUTES`` says who reads each, and
``optional(datamodule, name)`` is how the module, predictions and plots look them up (a name not declared there is
an error, so a lookup and its documentation cannot drift apart); a DataModule that does not derive from the base
reads as having the defaults.

The per-task extras a batch may carry (``Batch.extras``) are declared in ``gridtnp.batch.EXTRAS`` (those the core
reads; a task declares its own with ``gridtnp.batch.declare_extras``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

import lightning as L

from gridtnp.data.tasks import Task

#: The optional hooks of a DataModule (``GridDataModule`` gives each its default), with who reads them.
OPTIONAL_ATTRIBUTES: dict[str, str] = {
    "dim_x": "NeuralProcessModule.setup (input dimension check)",
    "dim_y": "NeuralProcessModule.setup (context sources and their Dy)",
    "variable_metadata": "NeuralProcessModule.on_save_checkpoint (data description kept with the weights)",
    "predictions_to_xarray": "gridtnp predict (predictions as an xarray.Dataset in physical units)",
    "geographic": "plots (inputs are latitude/longitude in degrees)",
    "task": "plots (the task's true posterior, task.posterior, when it has one)",
    "describe": "NeuralProcessModule.on_fit_start (one line on the data, printed)",
    "batch_size": "gridtnp.training.run_scale (tasks per step, reported)",
    "train_batches": "gridtnp.training.run_scale (global batches per training epoch, reported)",
    "target_box": "NeuralProcessModule.setup (a table of places, as the mos decoders have, covers the targets)",
    "lead_hours": "NeuralProcessModule.setup (forecast tasks: the metrics per lead hour, gridtnp.lead_metrics)",
}


class VariableMetadata(TypedDict):
    """One variable as a checkpoint keeps it: normalisation statistics and CF attributes."""

    mean: float
    std: float
    units: str
    long_name: str


class DataMetadata(TypedDict, total=False):
    """What ``variable_metadata()`` returns (kept in checkpoints as ``gridtnp_data``; ``gridtnp.predictions`` reads
    ``variables``, ``sources`` and ``target`` to normalise a user's inputs and un-normalise predictions)."""

    variables: dict[str, VariableMetadata]  # by variable name
    sources: dict[str, list[str]]  # context source -> the variables in its value columns
    target: list[str]  # the target's variables, one per output dimension
    store: str  # where the data came from (a path or URL, for the record)
    box: dict[str, Any]  # the training data's target_box: a grid-free model's predictions warn beyond it


class GridDataModule(L.LightningDataModule):
    """The base of gridtnp's DataModules: each optional hook with the default that switches its feature off.

    Attributes (override in a subclass, as class attributes or properties):
        dim_x: the tasks' input dimension (``NeuralProcessModule.setup`` refuses a model built for another); None:
            unchecked.
        dim_y: ``{context source: Dy}`` (must match the model's encoders); None: unchecked.
        geographic: inputs are (latitude, longitude) in degrees, drawn as maps by the plots.
        task: a ``Task``; plots draw its ``posterior`` (a GP task's) beside the prediction when it has one.
        batch_size: tasks per batch (reported with the run's scale); None: not reported.
        train_batches: global training batches per epoch, shared by the ranks (reported); None: not reported.
        predictions_to_xarray: ``(outputs: list[dict]) -> xarray.Dataset``, the predictions in physical units with
            coordinates for ``gridtnp predict``; None: the raw tensors are written per task.
        target_box: after ``setup``, ``{"axes": names, "targets": (lower, upper), "grid": (lower, upper)}``: the
            corners ``[dim_x]`` of the target locations and of the data's grid; None: unchecked.
        lead_hours: forecast tasks' lead hours (targets carry ``extras["lead_hours"]``): metrics per lead; None: none.
    """

    dim_x: int | None = None
    dim_y: dict[str, int] | None = None
    geographic: bool = False
    task: Task | None = None
    batch_size: int | None = None
    train_batches: int | None = None
    predictions_to_xarray: Callable[[list[dict[str, Any]]], Any] | None = None
    target_box: dict[str, Any] | None = None
    lead_hours: list[int] | None = None

    def variable_metadata(self) -> DataMetadata | None:
        """Normalisation statistics, names and units of the variables, kept with the checkpoint (None: nothing)."""
        return None

    def describe(self) -> str | None:
        """One line on what the tasks hold (after ``setup``), printed at the start of ``gridtnp fit`` (None:
        nothing)."""
        return None


def optional(datamodule: Any, name: str) -> Any:
    """The DataModule's optional hook ``name`` (declared in ``OPTIONAL_ATTRIBUTES``), or None where it has none."""
    if name not in OPTIONAL_ATTRIBUTES:
        raise KeyError(f"{name!r} is not a declared DataModule attribute; declared: {', '.join(OPTIONAL_ATTRIBUTES)}.")
    return getattr(datamodule, name, None)


def task_posterior(datamodule: Any) -> Callable[..., Any] | None:
    """The DataModule's task's true posterior (``task.posterior``), if it has one."""
    return getattr(optional(datamodule, "task"), "posterior", None)
