"""The hours of a forecast task (``task.context_hours``, ``task.lead_hours``), shared by the station + reanalysis and
the multi-source DataModules: the options' check, and the initial hours a split allows.

A forecast task starts at an initial hour ``t``: its context is drawn at the hours ``t + a .. t + b`` of
``context_hours = [a, b]`` (``a <= b <= 0``), its targets at ``t + h`` for each ``h`` of ``lead_hours``; every point
carries its hours from ``t`` as its first input.

* ``check_forecast_hours``: a task section's two options as tuples, or a ConfigError naming the key.
* ``forecast_offsets``: the hours from ``t`` a task reads: the context hours, then the ``lead_hours``.
* ``initial_hours``: the store index of each of those hours from each candidate initial hour, and which initial
  hours keep them all inside the split.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pandas as pd

from gridtnp.data.layout import DataError
from gridtnp.registry import ConfigError


def is_hour(value: object) -> bool:
    """``value`` is an integer number of hours (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_forecast(task: Any) -> bool:
    """Forecast tasks: ``task.context_hours`` or ``task.lead_hours`` set (both null: the same-hour task)."""
    return task.context_hours is not None or task.lead_hours is not None


def check_forecast_hours(task: Any) -> None:
    """Set ``task.context_hours`` and ``task.lead_hours`` (a frozen task section) as tuples, one defaulted when the
    other is set (``[0, 0]``, ``[0]``), or raise a ConfigError naming the key and what is allowed."""
    if not is_forecast(task):
        return
    window, leads = task.context_hours or (0, 0), task.lead_hours if task.lead_hours is not None else (0,)
    if isinstance(window, str) or len(window) != 2 or not all(map(is_hour, window)) or not window[0] <= window[1] <= 0:
        raise ConfigError(f"task.context_hours must be [a, b] integer hours with a <= b <= 0, e.g. [-2, 0]; "
                          f"got {task.context_hours!r}.")  # fmt: skip
    leads = [leads] if is_hour(leads) else list(leads)
    if not leads or not all(map(is_hour, leads)) or leads[0] < 0 or any(b <= a for a, b in itertools.pairwise(leads)):
        raise ConfigError(f"task.lead_hours must be increasing integer hours >= 0, e.g. [1, 3, 6]; "
                          f"got {task.lead_hours!r}.")  # fmt: skip
    object.__setattr__(task, "context_hours", (int(window[0]), int(window[1])))
    object.__setattr__(task, "lead_hours", tuple(int(h) for h in leads))


def forecast_offsets(task: Any) -> list[int]:
    """The hours from ``t`` a forecast task reads, ``[a .. b, *lead_hours]`` (an hour may appear twice)."""
    a, b = task.context_hours
    return [*range(a, b + 1), *task.lead_hours]


def initial_hours(
    time: pd.DatetimeIndex,
    hours: np.ndarray,
    task: Any,
    where: str,
    ok: np.ndarray | None = None,
    consecutive: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """``(at [T, O], inside [T])``: the store index of ``time[hours] + forecast_offsets(task)`` (-1 where the store
    has no such hour) from each of a split's store indices ``hours [T]``, and which of them (among ``ok [T]``) have
    every such hour in the split (``consecutive``: also at ``hours + offsets``, an hourly axis); a DataError naming
    ``where`` (the split's dates and the store) when none has."""
    offsets = forecast_offsets(task)
    at = np.stack([time.get_indexer(time[hours] + pd.Timedelta(hours=h)) for h in offsets], -1)
    inside = np.isin(at, hours).all(-1)
    if ok is not None:
        inside &= ok
    if consecutive:
        inside &= (at == hours[:, None] + np.asarray(offsets)).all(-1)
    if not inside.any():
        a, b = task.context_hours
        raise DataError(
            f"{where}: no initial hour has every context hour ({a} to {b} h) and lead hour "
            f"({list(task.lead_hours)} h) inside the split; widen its dates or shorten task.lead_hours."
        )
    return at, inside
