"""The sources of a multi-source task and its ``task:`` section: ``Source`` (``"u@850"``: variable ``u`` at level
850), ``level_indices`` (each source's level in a store) and ``MultiSourceTaskConfig`` (the sources, targets, window
or forecast hours of ``MultiSourceDataModule``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xarray as xr

from gridtnp.data.era5.forecast_hours import check_forecast_hours, is_forecast
from gridtnp.data.layout import DIMS, DataError
from gridtnp.data.sections import LoaderConfig, check_count, fraction_range
from gridtnp.registry import ConfigError


class Source:
    """One modality of a multi-source task: ``"u10"`` (a variable) or ``"u@850"`` (variable ``u`` at level 850).

    ``name`` is the context-source key (``"u850"`` for ``"u@850"``).
    """

    def __init__(self, spec: str) -> None:
        variable, _, level = str(spec).partition("@")
        if not variable or (level and not _is_number(level)):
            raise ConfigError(f"Variable {spec!r}: expected a name such as 'u10', or name@level such as 'u@850'.")
        self.spec, self.variable = str(spec), variable
        self.level = float(level) if level else None
        self.name = variable if self.level is None else f"{variable}{self.level:g}"

    def __repr__(self) -> str:
        return f"Source({self.spec!r})"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def level_indices(ds: xr.Dataset, sources: Sequence[Source], path: str) -> dict[str, int]:
    """``{source name: index on its variable's level dimension}`` for the sources with a level, or a DataError naming
    the store, the variable and what it holds."""
    level_index = {}
    for s in sources:
        var = ds[s.variable]
        extra = [d for d in var.dims if d not in DIMS]
        if len(extra) > 1 or var.dims[0] != "time" or var.dims[-2:] != DIMS[1:]:
            raise DataError(f"{path}: variable {s.variable!r} has dims {var.dims}; expected {DIMS}, optionally "
                            "with one level dimension after time.")  # fmt: skip
        if extra and s.level is None:
            levels = ", ".join(f"{v:g}" for v in var[extra[0]].values)
            raise DataError(f"{path}: variable {s.variable!r} has levels ({extra[0]}: {levels}); "
                            f"name one, e.g. '{s.variable}@{var[extra[0]].values[0]:g}'.")  # fmt: skip
        if not extra and s.level is not None:
            raise DataError(
                f"{path}: variable {s.variable!r} has no level dimension; write {s.variable!r}, not {s.spec!r}."
            )
        if extra:
            levels = var[extra[0]].values
            found = np.flatnonzero(np.isclose(levels.astype(np.float64), s.level))
            if found.size == 0:
                raise DataError(f"{path}: variable {s.variable!r} has no level {s.level:g} "
                                f"({extra[0]}: {', '.join(f'{v:g}' for v in levels)}).")  # fmt: skip
            level_index[s.name] = int(found[0])
    return level_index


@dataclass(frozen=True)
class MultiSourceTaskConfig:
    """What a multi-source task holds (``task:``).

    Args:
        variables: the context sources, ``"name"`` or ``"name@level"`` (e.g. ``["u@700", "v@700", "u10"]``).
        target_variables: the variables predicted at the targets, in ``variables``' notation (default: all).
        window: consecutive hours per task (T).
        context_fraction: ``(a, b)``: each source's context share per task ``~ U[a, b]`` (the paper's
            U[0.05, 0.25]).
        target_fraction: share of the points used as targets (the paper's 0.25; of the target hours' points for
            forecast tasks).
        context_hours: ``[a, b]`` (``a <= b <= 0``): forecast tasks from an initial hour ``t``: the contexts drawn
            from the points at hours ``t + a .. t + b``, every point at ``x = (hours from t, lat, lon)``; null:
            ``[0, 0]`` when ``lead_hours`` is set. Forecast tasks read these hours and ``lead_hours``, not ``window``.
        lead_hours: forecast targets drawn from the points at ``t + h`` for each ``h`` (increasing hours >= 0);
            null: ``[0]`` when ``context_hours`` is set. Both null: windows of ``window`` hours, ``x = (hour in the
            window, lat, lon)``.
    """

    variables: tuple[str, ...] = ("t2m",)
    target_variables: tuple[str, ...] | None = None
    window: int = 4
    context_fraction: tuple[float, float] = (0.05, 0.25)
    target_fraction: float = 0.25
    context_hours: tuple[int, int] | None = None
    lead_hours: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        check_forecast_hours(self)
        check_count("task.window", self.window, 1)
        if isinstance(self.variables, str) or not self.variables:
            raise ConfigError(
                f"task.variables must be a non-empty list such as ['u@700', 'v@700']; got {self.variables!r}."
            )
        names = [Source(v).name for v in self.variables]
        if len(set(names)) != len(names):
            raise ConfigError(f"task.variables {list(self.variables)} name a source twice.")
        targets = self.target_variables
        if isinstance(targets, str) or (targets is not None and not targets):
            raise ConfigError(f"task.target_variables must be a non-empty list (or null: all); got {targets!r}.")
        unknown = [t for t in (targets or ()) if Source(t).name not in names]
        if unknown:
            raise ConfigError(f"task.target_variables {list(targets)} must be a subset of task.variables {names}.")
        object.__setattr__(self, "variables", tuple(self.variables))
        object.__setattr__(self, "target_variables", None if targets is None else tuple(targets))
        object.__setattr__(self, "context_fraction", fraction_range("task.context_fraction", self.context_fraction))
        if not 0.0 < float(self.target_fraction) < 1.0:
            raise ConfigError(f"task.target_fraction must be in (0, 1); got {self.target_fraction!r}.")

    def slices(self) -> tuple[list[int], tuple[np.ndarray, np.ndarray] | None]:
        """The hours of a task's time slices (from its first hour, or forecasts' from ``t``: each hour once, in
        order) and, for forecasts, which slices the contexts and the targets use (``[T]`` each)."""
        if not self.forecast:
            return list(range(self.window)), None
        a, b = self.context_hours  # type: ignore[misc]
        hours = sorted({*range(a, b + 1), *self.lead_hours})  # type: ignore[misc]
        at = np.asarray(hours)
        return hours, ((at >= a) & (at <= b), np.isin(at, self.lead_hours))

    @property
    def forecast(self) -> bool:
        """Forecast tasks (``context_hours`` or ``lead_hours`` set): context and target hours apart."""
        return is_forecast(self)


DEFAULT_MULTISOURCE_TASK = MultiSourceTaskConfig()
#: 8 tasks a batch, 100 training batches an epoch, fixed sets of 16 (val) and 32 (test) batches.
MULTISOURCE_LOADER = LoaderConfig(batch_size=8, train_batches=100, val_batches=16, test_batches=32)
