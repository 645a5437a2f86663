"""What gridtnp reads from a DataModule beyond Lightning's hooks: every attribute optional, each with one meaning.

A DataModule for a new data source needs only Lightning's ``*_dataloader`` methods yielding ``gridtnp.Batch``
objects. Each attribute below, when it has it, switches on one feature; ``DataModuleContract`` spells them out
with their types, and ``optional(datamodule, name)`` is how the module, predictions and plots look them up (a name
not declared here is an error, so a lookup and its documentation cannot drift apart).

=========================  ==============================================  =========================================
attribute                  type                                            what reads it, and what for
=========================  ==============================================  =========================================
``dim_x``                  ``int``                                         ``NeuralProcessModule.setup``: refuses a
                                                                           model built for other input dimensions
``dim_y``                  ``dict[str, int]``                              ``NeuralProcessModule.setup``: the
                                                                           context sources and their Dy must match
                                                                           the model's encoders
``variable_metadata()``    ``() -> DataMetadata | None``                   ``NeuralProcessModule.on_save_checkpoint``:
                                                                           statistics, names and units kept with the
                                                                           weights for ``gridtnp.predictions.predict``
``predictions_to_xarray``  ``(outputs: list[dict]) -> xarray.Dataset``     ``gridtnp predict``: predictions in
                                                                           physical units with coordinates (without
                                                                           it the raw tensors are written per task)
``geographic``             ``bool``                                        plots: inputs are (latitude, longitude) in
                                                                           degrees, drawn as maps
``task``                   ``Task`` with an optional ``posterior``         plots: the true posterior (a GP task's)
                                                                           drawn beside the prediction
=========================  ==============================================  =========================================

The per-task extras a batch may carry (``Batch.extras``) are declared in ``gridtnp.batch.EXTRAS``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypedDict

from gridtnp.data.tasks import Task

#: The optional attributes a DataModule may have, with who reads them.
OPTIONAL_ATTRIBUTES: dict[str, str] = {
    "dim_x": "NeuralProcessModule.setup (input dimension check)",
    "dim_y": "NeuralProcessModule.setup (context sources and their Dy)",
    "variable_metadata": "NeuralProcessModule.on_save_checkpoint (data description kept with the weights)",
    "predictions_to_xarray": "gridtnp predict (predictions as an xarray.Dataset in physical units)",
    "geographic": "plots (inputs are latitude/longitude in degrees)",
    "task": "plots (the task's true posterior, task.posterior, when it has one)",
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


class DataModuleContract(Protocol):
    """The optional attributes of a gridtnp DataModule (see the module docstring for who reads each)."""

    dim_x: int
    dim_y: dict[str, int]
    geographic: bool
    task: Task

    def variable_metadata(self) -> DataMetadata | None:
        """Normalisation statistics, names and units of the variables, kept with the checkpoint."""
        ...

    def predictions_to_xarray(self, outputs: list[dict[str, Any]]) -> Any:
        """``predict_step`` outputs -> an ``xarray.Dataset`` with coordinates and physical units."""
        ...


def optional(datamodule: Any, name: str) -> Any:
    """The DataModule's optional attribute ``name`` (declared in ``OPTIONAL_ATTRIBUTES``), or None."""
    if name not in OPTIONAL_ATTRIBUTES:
        raise KeyError(f"{name!r} is not a declared DataModule attribute; declared: {', '.join(OPTIONAL_ATTRIBUTES)}.")
    return getattr(datamodule, name, None)


def task_posterior(datamodule: Any) -> Callable[..., Any] | None:
    """The DataModule's task's true posterior (``task.posterior``), if it has one."""
    return getattr(optional(datamodule, "task"), "posterior", None)
