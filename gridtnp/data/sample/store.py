"""``write_sample_store(out, train)``: the embedded ERA5 sample as a prepared store, without the prepare pipeline.

The sample is one small NetCDF file (744 hours x 33 x 49 points of t2m), so the store ``gridtnp data prepare`` would
write from it is made here in one pass in memory: latitudes ascending, float32, chunks of 24 hours, the training
dates' mean and std in ``attrs["gridtnp_stats"]`` (over the finite values, in float64) and a provenance record.
The readers (``gridtnp.data.store_datamodule``) call this, so reading never imports the writer.
"""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import xarray as xr
import zarr

from gridtnp.data.inventory import CHUNKS_ATTR, inventory
from gridtnp.data.layout import PROVENANCE_ATTR, STATS_ATTR, iso, select_time
from gridtnp.data.sample import ERA5_SAMPLE, sample_path

SAMPLE_TIME_CHUNK = 24


def sample_dataset() -> xr.Dataset:
    """The embedded ERA5 sample in the prepared layout: ``t2m [time, latitude, longitude]`` float32, latitudes
    ascending, longitudes in [-180, 180), the variable's CF attributes kept."""
    with xr.open_dataset(sample_path(ERA5_SAMPLE)) as source:
        ds = source[list(source.data_vars)].reset_coords(drop=True).load()
    ds = ds.sortby("latitude").sortby("longitude")
    for axis in ("latitude", "longitude"):
        if "stored_direction" in ds[axis].attrs:
            ds[axis].attrs["stored_direction"] = "increasing"
    for name in ds.variables:
        ds[name].encoding = {}
    return ds.astype({v: np.float32 for v in ds.data_vars})


def write_sample_store(out: str | os.PathLike[str], train: tuple[str, str]) -> Path:
    """Write the sample as a prepared store at ``out`` with statistics over the inclusive ``train`` dates; written
    beside ``out`` and renamed into place, so that concurrent callers never see half a store."""
    out = Path(out)
    ds = sample_dataset()
    period = select_time(ds, *train)
    first, last = iso(period.time.values[0]), iso(period.time.values[-1])
    stats = {}
    for name in ds.data_vars:
        values = period[name].values.astype(np.float64)
        finite = values[np.isfinite(values)]
        stats[name] = {
            "mean": float(finite.mean()),
            "std": float(finite.std()),
            "train_start": first,
            "train_end": last,
            "steps": int(period.sizes["time"]),
        }
    provenance = {
        "sources": [ERA5_SAMPLE],
        "command": f"gridtnp.data.sample.store.write_sample_store(train=({train[0]!r}, {train[1]!r}))",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    ds.attrs = {**ds.attrs, STATS_ATTR: stats, PROVENANCE_ATTR: provenance}
    steps = min(SAMPLE_TIME_CHUNK, ds.sizes["time"])
    encoding = {v: {"chunks": (steps, *ds[v].shape[1:]), "dtype": "float32"} for v in ds.data_vars}
    partial = out.with_name(f"{out.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    ds.to_zarr(partial, mode="w", encoding=encoding, consolidated=False, zarr_format=2)
    group = zarr.open_group(str(partial), mode="r+")
    group.attrs[CHUNKS_ATTR] = inventory(partial, list(ds.data_vars))
    zarr.consolidate_metadata(str(partial))
    try:
        partial.rename(out)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        if not out.exists():  # another process finished first otherwise
            raise
    return out
