"""Checks on ``gridtnp data prepare``'s inputs that would otherwise give a wrong store without a word.

* ``normalise_checked(ds, source)``: ``check_coordinates`` (no NaT time, no NaN latitude or longitude),
  ``merge_expver`` (the CDS's final ERA5 and ERA5T in one field), then ``gridtnp.data.layout.normalise``, then
  ``check_part``.
* ``check_part(ds, source)``: one normalised input: a longitude axis without a jump (a 0-360 box across the date
  line, unless a ``--region`` across it asks for one: ``check_longitudes``), at most one dimension besides
  ``time, latitude, longitude``, and each variable transposed to ``[time, ..., latitude, longitude]``.
* ``check_units(parts, paths)``: a variable held by several inputs has the same ``units`` in each.
* ``check_writable(path, option)``: the output's folder can be written; ``check_jobs(jobs)``: a read concurrency
  of at least 1.
* ``warn_time_gaps(time, where, after)``: a warning naming the stretches missing from the time axis (a daily file
  that failed to download is a day no task will see).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from gridtnp.data.layout import COORD_ALIASES, DIMS, DataError, normalise


def normalise_checked(ds: xr.Dataset, source: str, longitudes: bool = True) -> xr.Dataset:
    """``normalise(ds)`` with the checks of ``check_coordinates`` and ``merge_expver`` before and ``check_part``
    after it (``longitudes`` False: the longitude axis is checked once cut to a ``--region``)."""
    normalised = normalise(merge_expver(check_coordinates(ds, source), source), source)
    return check_part(normalised, source, longitudes)


EXPVER = "expver"


def merge_expver(ds: xr.Dataset, source: str) -> xr.Dataset:
    """``ds`` without the ``expver`` dimension of ERA5 fetched from the CDS across the end of final data (1: final
    ERA5, 5: preliminary ERA5T; each step has its values in one of them): every point takes the final value where
    it has one, else ERA5T's, with a warning (ECMWF may still revise ERA5T). Other experiment versions are refused.
    Without the merge the store would hold an ``expver`` dimension, half of it NaN, as if it were a level."""
    if EXPVER not in ds.dims:
        return ds
    try:
        versions = [int(str(v).strip()) for v in ds[EXPVER].values]  # 1 and 5, or "0001" and "0005"
    except ValueError:
        versions = []
    if 1 not in versions or not set(versions) <= {1, 5}:
        raise DataError(
            f"{source}: its expver dimension holds {ds[EXPVER].values.tolist()}; expected ERA5's 1 (final) and 5 "
            "(ERA5T), which are merged. Select one experiment version first (e.g. ds.sel(expver=1))."
        )
    order = sorted(range(len(versions)), key=versions.__getitem__)
    merged = ds.isel({EXPVER: order[0]}, drop=True)
    for i in order[1:]:
        merged = merged.where(merged.notnull(), ds.isel({EXPVER: i}, drop=True))
    if 5 in versions:
        warnings.warn(
            f"{source}: final ERA5 (expver 1) and preliminary ERA5T (expver 5) are merged, each point from final "
            "ERA5 where it has a value; ECMWF may still revise the ERA5T steps: prepare them again once final.",
            UserWarning,
            stacklevel=2,
        )
    return merged


def check_coordinates(ds: xr.Dataset, source: str) -> xr.Dataset:
    """Refuse missing values (NaT times, NaN latitudes or longitudes) in ``ds``'s coordinates, as stored."""
    for canonical, aliases in COORD_ALIASES.items():
        for name in ds.variables:
            if str(name).lower() not in aliases:
                continue
            values = np.atleast_1d(ds[name].values)
            if np.issubdtype(values.dtype, np.datetime64):
                missing = int(np.isnat(values).sum())
                if missing:
                    raise DataError(
                        f"{source}: {missing} {name} value(s) are missing (NaT); expected every time step dated."
                    )
            elif np.issubdtype(values.dtype, np.number) and not np.isfinite(values).all():
                raise DataError(f"{source}: {canonical} has missing (NaN) values; expected every {canonical} given.")
    return ds


def check_part(ds: xr.Dataset, source: str, longitudes: bool = True) -> xr.Dataset:
    """``ds`` with every variable in the documented dimension order; a ``DataError`` for what cannot be used."""
    if longitudes:
        check_longitudes(ds["longitude"].values.astype(np.float64), source)
    order = {}
    for name, var in ds.data_vars.items():
        if not set(DIMS) <= set(var.dims):
            continue
        extra = [d for d in var.dims if d not in DIMS]
        if len(extra) > 1:
            raise DataError(
                f"{source}: variable {name!r} has {len(extra)} dimensions besides time, latitude and longitude "
                f"({', '.join(map(str, extra))}); a prepared store holds at most one (e.g. pressure level). Select "
                f"one value of the others first (e.g. ds.sel({extra[0]}=...))."
            )
        wanted = ("time", *extra, "latitude", "longitude")
        if var.dims != wanted:
            order[name] = wanted
    for name, wanted in order.items():
        ds[name] = ds[name].transpose(*wanted)
    return ds


def check_longitudes(lon: np.ndarray, source: str) -> None:
    """Refuse a sorted, wrapped longitude axis with one step much wider than the rest: a box across the date line
    that no ``--region`` across it asked for."""
    if lon.size < 3:
        return
    steps = np.diff(lon)
    typical = float(np.median(steps))
    wide = int(np.argmax(steps))
    if steps[wide] > 1.5 * typical + 1e-9 and lon[-1] - lon[0] + typical > 359.0:
        raise DataError(
            f"{source}: the longitudes cross the date line (after wrapping to [-180, 180) they run "
            f"{lon[0]:g}..{lon[wide]:g} and {lon[wide + 1]:g}..{lon[-1]:g}, a {steps[wide]:g} degree jump inside the "
            "axis); pass a --region across it (LON_MIN > LON_MAX, e.g. --region -90 90 "
            f"{lon[wide + 1]:g} {lon[wide]:g}) to keep the box whole, or prepare either side of 180E separately."
        )


def check_units(parts: Sequence[xr.Dataset], paths: Sequence[Any]) -> None:
    """Refuse inputs that hold the same variable in different ``units`` (they would be mixed in one array)."""
    seen: dict[str, tuple[str, Any]] = {}
    for part, path in zip(parts, paths, strict=True):
        for name, var in part.data_vars.items():
            units = str(var.attrs.get("units", "")).strip()
            if str(name) not in seen:
                seen[str(name)] = (units, path)
                continue
            first, first_path = seen[str(name)]
            if units != first:
                raise DataError(
                    f"variable {name!r} is in {first or '(no units)'!r} in {first_path} and in "
                    f"{units or '(no units)'!r} in {path}; expected the same units in every input. Convert one "
                    "file first."
                )


def check_writable(path: Any, option: str) -> None:
    """Refuse an output whose folder cannot be written (a read-only disk or folder), before any work is done."""
    folder = Path(path).parent
    if folder.is_dir() and not os.access(folder, os.W_OK):
        raise DataError(f"{option} {path}: the folder {folder} is not writable; choose a writable location.")


def check_jobs(jobs: int | None) -> None:
    """Refuse a ``--jobs`` below 1 (None: the default)."""
    if jobs is not None and jobs < 1:
        raise DataError(f"--jobs {jobs}: expected at least 1 concurrent read (or leave it out for the default).")


def warn_time_gaps(time: pd.DatetimeIndex, where: str, after: Any = None) -> None:
    """Warn (``UserWarning``) when the ascending ``time`` axis skips steps: where two consecutive steps lie more
    than 1.5 of its usual step (the most common one) apart, and between ``after`` (a store's last step, when
    appending) and its first step. Gaps may be meant (winters only), so this is no error; a decade of daily files
    with one missing would otherwise train without that day and say nothing."""
    stamps = pd.DatetimeIndex(time)
    if after is not None:
        stamps = pd.DatetimeIndex([pd.Timestamp(after)]).append(stamps)
    if len(stamps) < 3:
        return
    steps = np.diff(stamps.asi8)
    values, counts = np.unique(steps, return_counts=True)
    step = int(values[counts.argmax()])
    gaps = np.flatnonzero(steps > 1.5 * step)
    if not len(gaps):
        return
    usual = pd.Timedelta(step, "ns")
    missing = [(stamps[i] + usual, stamps[i + 1] - usual, round(steps[i] / step) - 1) for i in gaps]
    listed = "; ".join(f"{a:%Y-%m-%dT%H:%M} to {b:%Y-%m-%dT%H:%M} ({n} steps)" for a, b, n in missing[:3])
    more = f"; and {len(missing) - 3} more" if len(missing) > 3 else ""
    hours = usual / pd.Timedelta(hours=1)
    length = f"{hours:g} h" if hours < 48 else f"{hours / 24:g} days"
    warnings.warn(
        f"{where}: the time axis skips {sum(n for *_, n in missing)} steps of {length} in {len(missing)} gap(s): "
        f"{listed}{more}. An input file missing? No task will see those hours, and multi-source windows do not "
        "span them.",
        UserWarning,
        stacklevel=2,
    )
