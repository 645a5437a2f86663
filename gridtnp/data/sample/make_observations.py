"""Writes the embedded synthetic observation file ``observations_t2m_uk_2019-03.csv.gz`` from the ERA5 sample.

    python -m gridtnp.data.sample.make_observations [--out PATH]

Synthetic station observations in the long format of docs/data.md ("Station observations"), fixed by ``SEED``:
ERA5 t2m bilinearly interpolated at the HadISD station locations inside the sample's box (each moved by up
to 0.1 degree off its 0.25 degree grid point), plus N(0, 0.5 K) noise; a few stations biased (+1.5 K, -2 K); 3 %
of reports missing at random and a few multi-day outages; some stations reporting 3-hourly; some reports a few
minutes off the hour; a few reports sent twice (identical); a few spikes flagged (``t2m_flag`` 2 or 3). Station
identifiers (``UK001``, ...) are made up: HadISD gives only the locations here.
"""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from gridtnp.data.sample import OBSERVATIONS_SAMPLE, STATIONS_SAMPLE, sample_path
from gridtnp.data.sample.store import sample_dataset
from gridtnp.data.stations import read_stations

SEED = 44
STATIONS = 250  # all distinct grid points inside the box: 218
NOISE_K = 0.5
BIASES_K = (1.5, 1.5, -2.0, -2.0)
MISSING = 0.03
OUTAGES = 4  # stations with one outage of 2 to 5 days
THREE_HOURLY = 0.2  # share of stations reporting at 00, 03, ... UTC only
OFF_HOUR = 0.05  # share of reports 1 to 12 minutes off the hour
DUPLICATES = 12
FLAGGED = 15


def observations(seed: int = SEED) -> pd.DataFrame:
    """The synthetic reports, one a row, in file order (by station, then time)."""
    rng = np.random.default_rng(seed)
    ds = sample_dataset()
    lat, lon = ds["latitude"].values, ds["longitude"].values
    table = read_stations(sample_path(STATIONS_SAMPLE), lat, lon)
    inside = table[table["inside"] & ~table["duplicate"]].reset_index(drop=True)
    pick = np.sort(rng.choice(len(inside), size=min(STATIONS, len(inside)), replace=False))
    stations = inside.iloc[pick].reset_index(drop=True)
    s = len(stations)
    jitter = rng.uniform(-0.1, 0.1, size=(s, 2))
    st_lat = np.clip(stations["latitude"].to_numpy() + jitter[:, 0], lat.min(), lat.max())
    st_lon = np.clip(stations["longitude"].to_numpy() + jitter[:, 1], lon.min(), lon.max())
    where = {"latitude": xr.DataArray(st_lat, dims="station"), "longitude": xr.DataArray(st_lon, dims="station")}
    values = ds["t2m"].interp(where, method="linear").transpose("time", "station").values.astype(np.float64)
    t = len(ds["time"])
    bias = np.zeros(s)
    bias[rng.choice(s, size=len(BIASES_K), replace=False)] = BIASES_K
    values = values + bias + rng.normal(0.0, NOISE_K, size=(t, s))  # [T, S]

    hours = pd.DatetimeIndex(ds["time"].values)
    keep = rng.random((t, s)) >= MISSING
    keep &= ~((hours.hour.to_numpy() % 3 != 0)[:, None] & (rng.random(s) < THREE_HOURLY)[None])
    for station in rng.choice(s, size=OUTAGES, replace=False):
        start, days = rng.integers(0, t - 120), rng.integers(2, 6)
        keep[start : start + 24 * days, station] = False
    ti, si = np.nonzero(keep)  # [N] report hour and station
    order = np.lexsort((ti, si))
    ti, si = ti[order], si[order]
    minutes = np.where(rng.random(len(ti)) < OFF_HOUR, rng.integers(1, 13, len(ti)) * rng.choice([-1, 1], len(ti)), 0)
    time = hours[ti] + pd.to_timedelta(minutes, unit="min")
    out = pd.DataFrame(
        {
            "station_id": [f"UK{k + 1:03d}" for k in si],
            "time": time.strftime("%Y-%m-%dT%H:%MZ"),
            "latitude": np.round(st_lat[si], 4),
            "longitude": np.round(st_lon[si], 4),
            "t2m": np.round(values[ti, si], 2),
            "t2m_flag": "",
        }
    )
    flagged = rng.choice(len(out), size=FLAGGED, replace=False)  # spikes a quality check caught
    out.loc[flagged, "t2m"] = np.round(out.loc[flagged, "t2m"] + rng.choice([-12.0, 15.0], FLAGGED), 2)
    out.loc[flagged, "t2m_flag"] = rng.choice(["2", "3"], FLAGGED)
    repeats = rng.choice(len(out), size=DUPLICATES, replace=False)  # reports sent twice
    out = pd.concat([out, out.iloc[repeats]]).sort_index(kind="stable").reset_index(drop=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=sample_path(OBSERVATIONS_SAMPLE), help="the file to write")
    args = parser.parse_args()
    table = observations()
    with open(args.out, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as out:
        out.write(table.to_csv(index=False).encode())  # no name or time in the header: the same bytes each run
    print(f"{args.out}: {len(table):,} reports of {table['station_id'].nunique()} stations")


if __name__ == "__main__":
    main()
