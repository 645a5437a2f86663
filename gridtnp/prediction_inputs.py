"""Checks of the predict API's xarray inputs, before anything is normalised or predicted.

* ``utc_times(values, what)``: times (datetime64, timezone-aware ``pandas.Timestamp``) as naive UTC, the clock of
  the checkpoint's climatology; a ``cftime`` date is refused with the conversion to use.
* ``check_context(model, context, coords, batch_dim)``: the sources named as the model names them, no dimension the
  coordinates do not span, and with ``batch_dim`` the sources paired by its values, not by position.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
import xarray as xr

from gridtnp.registry import ConfigError


def utc_times(values: Any, what: str) -> pd.DatetimeIndex:
    """Times ``[B]`` (a scalar, datetime64, or timezone-aware ``pandas.Timestamp``) as naive UTC; ``cftime`` and
    other non-calendar times are a ``ConfigError``."""
    values = np.atleast_1d(values)
    if values.dtype == object and any(type(v).__module__.startswith("cftime") for v in values.ravel()):
        raise ConfigError(
            f"predict: {what} is a cftime date ({type(values.ravel()[0]).__name__}); convert it to numpy datetime64 "
            "first (e.g. ds.convert_calendar('standard') or ds.indexes['time'].to_datetimeindex())."
        )
    try:
        times = pd.DatetimeIndex(pd.to_datetime(values.ravel()))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"predict: {what} is not a date and time ({err}).") from err
    if times.tz is not None:  # 12:00 Europe/Berlin is 11:00 UTC, the climatology's clock
        times = times.tz_convert("UTC").tz_localize(None)
    return times


def check_context(
    model: Any, context: Mapping[str, xr.DataArray], coords: Sequence[str], batch_dim: str | None
) -> dict[str, xr.DataArray]:
    """The context checked against the model's sources and each other: every source named as the model names it,
    no dimension that is neither a point dimension nor ``batch_dim``, and with ``batch_dim`` the sources aligned by
    its coordinate (the same values in any order; other values or lengths are refused)."""
    context = dict(context)
    if not context:
        raise ConfigError("predict: the context is empty; pass {source: DataArray} for each of the model's sources.")
    encoders = getattr(model, "encoders", None)
    sources = [str(k) for k in encoders] if isinstance(encoders, Mapping | torch.nn.ModuleDict) else None
    if sources is not None and len(sources) > 1:
        unknown = [name for name in context if name not in sources]
        if unknown:
            close = difflib.get_close_matches(unknown[0], sources, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"predict: context source {unknown[0]!r} is not one of the model's sources {sources}{hint}."
            )
        missing = [name for name in sources if name not in context]
        if missing:
            raise ConfigError(f"predict: the context lacks the model's source(s) {missing}; it has {list(context)}.")
    for name, array in context.items():
        if batch_dim is not None and batch_dim not in array.dims:
            raise ConfigError(
                f"predict: context {name!r} has no dimension {batch_dim!r} (batch_dim); its dimensions are "
                f"{list(map(str, array.dims))}."
            )
        spanned = {d for c in coords if c in array.coords for d in array[c].dims}
        extra = [str(d) for d in array.dims if d != batch_dim and d not in spanned]
        if extra and spanned:
            raise ConfigError(
                f"predict: context {name!r} has dimension(s) {extra} that its coordinates {list(coords)} do not "
                f"span; pass batch_dim={extra[0]!r} for one task per {extra[0]}, or select one value."
            )
    if batch_dim is None:
        return context
    first_name, first = next(iter(context.items()))
    reference = first[batch_dim].values if batch_dim in first.coords else None
    for name, array in list(context.items())[1:]:
        if array.sizes[batch_dim] != first.sizes[batch_dim]:
            raise ConfigError(
                f"predict: context {name!r} has {array.sizes[batch_dim]} entries along {batch_dim!r} and "
                f"{first_name!r} {first.sizes[batch_dim]}; expected the same {batch_dim} in every source."
            )
        if reference is None or batch_dim not in array.coords:
            continue
        values = array[batch_dim].values
        if np.array_equal(values, reference):
            continue
        if set(values.tolist()) != set(reference.tolist()) or len(set(values.tolist())) != len(values):
            raise ConfigError(
                f"predict: context {name!r} covers other {batch_dim} values than {first_name!r} "
                f"({values[0]} .. {values[-1]} vs {reference[0]} .. {reference[-1]}); expected the same {batch_dim} "
                "in every source."
            )
        context[name] = array.sel({batch_dim: reference})  # paired by value, not by position
    return context
