"""The predict API's xarray inputs: checked, then turned into the model's normalised tensors.

* ``utc_times(values, what)``: times (datetime64, timezone-aware ``pandas.Timestamp``) as naive UTC, the clock of
  the checkpoint's climatology; a ``cftime`` date is refused with the conversion to use.
* ``check_context(model, context, coords, batch_dim)``: the sources named as the model names them, no dimension the
  coordinates do not span, and with ``batch_dim`` the sources paired by its values, not by position.
* ``checkpoint_statistics(module)``: the normalisation statistics, names and units a checkpoint keeps.
* ``observations(name, array, coords, batch_dim, stats, origin, centre)``: one context source as ``Observations``.
* ``template(obj, coords)`` and ``points(template, coords, what, centre)``: the targets' locations ``[N, Dx]``.
* ``station_targets(table)``: the stations of a table of station reports (``read_observations``'s, or any with
  ``station_id``, ``latitude``, ``longitude`` and optional ``elevation`` columns) as targets, ids kept.
* ``geographic_inputs(x, coords, what, centre)`` and ``longitude_centre(model, coords)``: latitudes checked,
  longitudes wrapped into the convention of the model's grid.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
import xarray as xr

from gridtnp.batch import Observations
from gridtnp.data.layout import wrap_longitude
from gridtnp.registry import ConfigError

Stats = tuple[float, float]
#: Context values whose mean or standard deviation exceed this are taken for physical units (normalised values are
#: O(1)); ``predict`` then needs their statistics.
RAW_UNITS = 10.0
#: ``units`` attributes of values that need no normalisation statistics.
UNITLESS = ("", "1", "normalised", "normalized")


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


def station_targets(table: pd.DataFrame) -> xr.Dataset:
    """Each station ``[S]`` of ``table`` (one row per report or per station) once, in order of first appearance:
    a ``(station,)`` Dataset whose ``station`` coordinate is the ``station_id`` and with ``latitude``,
    ``longitude`` (and ``elevation`` where the table has it) coordinates."""
    missing = [c for c in ("station_id", "latitude", "longitude") if c not in table.columns]
    if missing:
        raise ConfigError(
            f"predict: the targets table has no column {', '.join(missing)}; a table of stations needs station_id, "
            f"latitude and longitude (and may have elevation); it has {', '.join(map(str, table.columns))}."
        )
    first = table.drop_duplicates("station_id")
    ids = first["station_id"].astype(str).to_numpy().astype(object)
    coords: dict[str, Any] = {"station": ids}
    for name in ("latitude", "longitude", "elevation"):
        if name in first.columns and (name != "elevation" or first[name].notna().any()):
            coords[name] = ("station", first[name].to_numpy(np.float64))
    return xr.Dataset(coords=coords)


def template(obj: xr.DataArray | xr.Dataset, coords: Sequence[str]) -> xr.DataArray:
    """A DataArray spanning ``obj``'s points: itself, its first variable, or its coordinates broadcast together."""
    if isinstance(obj, xr.DataArray):
        return obj
    spanning = [v for v in obj.data_vars.values() if all(c in v.coords for c in coords)]
    if spanning:  # a variable located by the coordinates (not a scalar beside them)
        return spanning[0]
    missing = [c for c in coords if c not in obj.coords]
    if missing:
        raise ConfigError(f"predict: targets have no coordinate {', '.join(missing)}; have {', '.join(obj.coords)}.")
    return xr.broadcast(*[obj[c] for c in coords])[0]


def points(template: xr.DataArray, coords: Sequence[str], what: str, centre: float = 0.0) -> np.ndarray:
    """Locations ``[N, Dx]`` of every element of ``template`` (C order over its dims) from its ``coords``
    (longitudes within 180 degrees of ``centre``)."""
    missing = [c for c in coords if c not in template.coords]
    if missing:
        raise ConfigError(
            f"predict: {what} has no coordinate {', '.join(missing)} (has {', '.join(map(str, template.coords))}); "
            "pass coords=... naming the model's inputs in order."
        )
    grids = [template[c].broadcast_like(template).transpose(*template.dims).values.reshape(-1) for c in coords]
    return geographic_inputs(np.stack(grids, -1).astype(np.float64), coords, what, centre).astype(np.float32)


def geographic_inputs(x: np.ndarray, coords: Sequence[str], what: str, centre: float = 0.0) -> np.ndarray:
    """Check and normalise the geographic columns of ``x [N, Dx]`` (named by ``coords``): latitudes must lie in
    [-90, 90] (else a ``ConfigError``), longitudes are wrapped into [centre - 180, centre + 180): [-180, 180) for
    the models trained on prepared stores, one run past 180 degrees for a model of a box across the date line
    (``longitude_centre``)."""
    x = x.copy()
    for d, name in enumerate(coords):
        column = x[:, d]
        if name in ("latitude", "lat") and column.size and not np.all(np.abs(column[np.isfinite(column)]) <= 90):
            bad = column[np.isfinite(column) & (np.abs(column) > 90)]
            raise ConfigError(
                f"predict: {what} has latitudes outside [-90, 90] (e.g. {bad[0]:g}); latitudes are in degrees north."
            )
        if name in ("longitude", "lon"):
            x[:, d] = wrap_longitude(column, centre)
    return x


def checkpoint_statistics(module: Any) -> tuple[dict[str, Stats], list[Stats], list[dict[str, str]]]:
    """The statistics a checkpoint keeps (``NeuralProcessModule.data_metadata``, ``gridtnp_data``): ``(mean, std)``
    per context source with one variable, per target output, and the target variables' ``units``/``long_name``."""
    meta = getattr(module, "data_metadata", None) or {}
    variables = meta.get("variables", {})
    sources = {
        source: (variables[names[0]]["mean"], variables[names[0]]["std"])
        for source, names in meta.get("sources", {}).items()
        if len(names) == 1 and names[0] in variables
    }
    target_names = [v for v in meta.get("target", []) if v in variables]
    targets = [(variables[v]["mean"], variables[v]["std"]) for v in target_names]
    attrs = [{"units": variables[v]["units"], "long_name": variables[v]["long_name"]} for v in target_names]
    return sources, targets, attrs


def longitude_centre(model: torch.nn.Module, coords: Sequence[str]) -> float:
    """The middle of the longitudes a gridded ``model``'s grid spans (its input named ``longitude`` or ``lon`` in
    ``coords``): 0 for a global grid, 170 for a box from 140 E to 160 W trained as 140 to 200; 0 without a grid."""
    grid = getattr(model, "grid", None)
    d = next((i for i, c in enumerate(coords) if c in ("longitude", "lon")), None)
    if grid is None or d is None or d >= len(grid.lower):
        return 0.0
    return float(grid.lower[d] + grid.upper[d]) / 2.0


def observations(
    name: str,
    array: xr.DataArray,
    coords: Sequence[str],
    batch_dim: str | None,
    stats: Stats | None,
    origin: str,
    centre: float = 0.0,
) -> Observations:
    """One context source ``[B, N, 1]``: ``B`` entries along ``batch_dim`` (or 1), every other element a point.

    Values are normalised with ``stats`` (``origin`` says where they came from, for errors); without statistics,
    values that look physical (a ``units`` attribute, or mean or std above ``RAW_UNITS``) are refused.
    """
    values = array.expand_dims("_task") if batch_dim is None else array.rename({batch_dim: "_task"})
    values = values.transpose("_task", ...)
    x = points(values.isel(_task=0, drop=True), coords, f"context {name!r}", centre)
    y = values.values.reshape(values.sizes["_task"], -1).astype(np.float64)
    y[~np.isfinite(y)] = np.nan  # +-inf is missing, like NaN
    units = str(array.attrs.get("units", "")).strip()
    has_values = bool(np.isfinite(y).any())
    if stats is not None:
        y = (y - stats[0]) / stats[1]
        if has_values and (abs(np.nanmean(y)) > RAW_UNITS or np.nanstd(y) > RAW_UNITS):
            raise ConfigError(
                f"predict: context {name!r} normalised with {origin} (mean {stats[0]:.4g}, std {stats[1]:.4g}) has "
                f"mean {np.nanmean(y):.4g} and std {np.nanstd(y):.4g}, far from the normalised values the model "
                "was trained on: are the values in other units, or already normalised (then pass "
                f"stats={{{name!r}: (0.0, 1.0)}})?"
            )
    elif units not in UNITLESS or (has_values and (abs(np.nanmean(y)) > RAW_UNITS or np.nanstd(y) > RAW_UNITS)):
        if units not in UNITLESS:
            what = f"has units {units!r}"
        else:
            what = f"has values of mean {np.nanmean(y):.4g} and std {np.nanstd(y):.4g}"
        raise ConfigError(
            f"predict: context {name!r} {what}: physical units rather than the normalised values the model was "
            f"trained on, and neither the caller nor the model's checkpoint gives its statistics. Pass "
            f"stats={{{name!r}: (mean, std)}} (the training statistics, e.g. from "
            "gridtnp.data.store.normalisation_stats), load a checkpoint trained by gridtnp fit on an ERA5 "
            "DataModule (it keeps them), or normalise the values yourself."
        )
    xs = torch.from_numpy(x).expand(y.shape[0], -1, -1)
    return Observations(xs, torch.from_numpy(y.astype(np.float32)).unsqueeze(-1))
