"""Reports joined to a store's hours: ``observations_to_hours(table, time_axis, lat, lon, variables, tolerance)``.

Rules (docs/data.md, "Station observations"):

* A report belongs to the store time nearest to it when it lies within ``tolerance`` of that time (a report
  exactly half-way between two times goes to the earlier). Others are dropped with a line: ``outside the store``
  (before the first time or after the last, beyond the tolerance) or ``between hours`` (farther than the
  tolerance from every store time).
* Two reports of one station joined to the same hour (say 11:50 and 12:10): the one nearer the hour is kept (the
  earlier on a tie), without a line (counted in ``HourlyObservations.merged``).
* A station outside the store's box (its nearest grid point more than half a cell away) is dropped; one line
  names all such stations.
* No report, or an empty or flagged value, at an hour: ``NaN`` in ``values``, ``False`` in ``mask``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gridtnp.data.observations.table import Problem
from gridtnp.data.stations import snap_to_grid


@dataclass
class HourlyObservations:
    """Reports on a store's time axis: ``values [R, S, V]`` (NaN: no report) at store time indices ``hours [R]``.

    ``stations`` ``[S rows]``: ``station_id``, ``latitude``, ``longitude`` (the file's), ``elevation`` (NaN when
    not given), ``lat_index``, ``lon_index`` (nearest grid point), ``line`` (a file line of the station), sorted by
    ``station_id``. ``merged``: reports left out because another of the station was nearer the same hour.
    """

    stations: pd.DataFrame
    hours: np.ndarray
    values: np.ndarray
    variables: list[str]
    merged: int = 0

    @property
    def mask(self) -> np.ndarray:
        """``[R, S, V]`` bool: a value was reported."""
        return np.isfinite(self.values)

    def row_of_hour(self, num_times: int) -> np.ndarray:
        """``[num_times]``: the row of ``values`` for each store time index, -1 where no station reported."""
        rows = np.full(num_times, -1, dtype=np.int64)
        rows[self.hours] = np.arange(len(self.hours))
        return rows

    def at_hours(self, hours: np.ndarray) -> np.ndarray:
        """``[len(hours), S, V]`` values at store time indices ``hours`` (NaN where nothing was reported)."""
        rows = np.full(int(max(hours.max(initial=0), self.hours.max(initial=0))) + 1, -1, dtype=np.int64)
        rows[self.hours] = np.arange(len(self.hours))
        at = rows[hours]
        out = self.values[np.maximum(at, 0)] if len(self.values) else np.full((len(hours), *self.values.shape[1:]), 0)
        return np.where((at >= 0)[:, None, None], out, np.nan).astype(np.float32)


def minutes(span: object) -> str:
    """A time span as minutes: ``"20 min"``."""
    return f"{pd.Timedelta(span).total_seconds() / 60:g} min"


def nearest_time(times: np.ndarray, axis: pd.DatetimeIndex) -> tuple[np.ndarray, np.ndarray]:
    """``(index [N], distance [N] as timedelta64)``: the nearest time of a sorted ``axis`` to each of ``times``
    (the earlier of two at equal distance)."""
    t = np.asarray(times, dtype="datetime64[ns]")
    grid = axis.to_numpy(dtype="datetime64[ns]")
    after = np.clip(np.searchsorted(grid, t, side="left"), 0, len(grid) - 1)
    before = np.clip(after - 1, 0, len(grid) - 1)
    d_after, d_before = np.abs(grid[after] - t), np.abs(t - grid[before])
    pick = np.where(d_before <= d_after, before, after)
    return pick, np.minimum(d_before, d_after)


def observations_to_hours(
    table: pd.DataFrame,
    time_axis: pd.DatetimeIndex,
    lat: np.ndarray,
    lon: np.ndarray,
    variables: list[str],
    tolerance: str | pd.Timedelta = "30min",
    source: str = "observations",
) -> tuple[HourlyObservations, list[Problem]]:
    """Reports (``read_observations``'s table) on the store's time axis ``[T]`` and inside its grid ``lat [H]``,
    ``lon [W]``: the hourly values and a line for each dropped report and one for the stations outside the box."""
    tol = pd.Timedelta(tolerance)
    if tol < pd.Timedelta(0):
        raise ValueError(f"observations.time_tolerance must be >= 0; got {tolerance!r}.")
    problems: list[Problem] = []
    index, distance = nearest_time(table["time"].to_numpy(), time_axis)
    times = table["time"].to_numpy("datetime64[ns]")
    first, last = time_axis[0].to_datetime64(), time_axis[-1].to_datetime64()
    outside = (times < first - tol.to_timedelta64()) | (times > last + tol.to_timedelta64())
    between = ~outside & (distance > tol.to_timedelta64())
    span = f"{pd.Timestamp(first).isoformat()} to {pd.Timestamp(last).isoformat()}"
    for i in np.flatnonzero(outside | between):  # the dropped reports only
        when = pd.Timestamp(times[i]).isoformat()
        if outside[i]:
            message = (
                f"time outside the store: {when} is not within {minutes(tol)} of the store's times {span}; dropped"
            )
        else:
            nearest = pd.Timestamp(time_axis[index[i]]).isoformat()
            message = (
                f"between hours: {when} is {minutes(distance[i])} from the nearest store time {nearest}, "
                f"beyond time_tolerance {minutes(tol)}; dropped"
            )
        problems.append(Problem(source, int(table["line"].iloc[i]), "time", message, False))
    joined = table.assign(hour=index, distance=distance)[~(outside | between)]

    stations = joined.groupby("station_id", sort=True).first().reset_index()
    if "elevation" not in stations:
        stations["elevation"] = np.nan
    snapped = snap_to_grid(stations, lat, lon)
    stations["lat_index"], stations["lon_index"] = snapped.lat_index, snapped.lon_index
    if (~snapped.inside).any():
        away = stations[~snapped.inside]
        named = ", ".join(f"{r.station_id} ({r.latitude:g}, {r.longitude:g})" for r in away.itertuples())
        box = f"latitude {lat.min():g} to {lat.max():g}, longitude {lon.min():g} to {lon.max():g}"
        problems.append(
            Problem(
                source,
                None,
                "latitude, longitude",
                f"{len(away)} station(s) outside the store's box ({box}, with half a cell around) dropped: {named}",
                False,
            )
        )
        stations = stations[snapped.inside].reset_index(drop=True)
        joined = joined[joined["station_id"].isin(stations["station_id"])]
    stations = stations[["station_id", "latitude", "longitude", "elevation", "lat_index", "lon_index", "line"]]

    # The nearest report of each station to each hour (the earlier on a tie: reports sorted by time first).
    ordered = joined.sort_values(["station_id", "hour", "distance", "time"], kind="stable")
    kept = ordered.drop_duplicates(["station_id", "hour"], keep="first")
    hours, row = np.unique(kept["hour"].to_numpy(np.int64), return_inverse=True)
    column = pd.Index(stations["station_id"]).get_indexer(kept["station_id"])
    values = np.full((len(hours), len(stations), len(variables)), np.nan, dtype=np.float32)
    values[row, column] = kept[variables].to_numpy(np.float32)
    merged = len(ordered) - len(kept)
    return HourlyObservations(stations, hours, values, list(variables), merged), problems
