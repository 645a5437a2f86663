"""The store ``gridtnp data prepare`` and ``--append`` write: its target path, variables and attributes.

* ``check_target(out, overwrite)``: refuse what may not be replaced; ``is_prepared_store``, ``is_zarr_store``,
  ``remove_leftovers``.
* ``to_float32(ds)``, ``stats_attr(...)``, ``provenance_attr(...)``, ``finish_store(...)``: what the data is written
  as, and the statistics, provenance and consolidated metadata written around it.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from gridtnp.data.inventory import CHUNKS_ATTR, inventory
from gridtnp.data.layout import (
    PROVENANCE_ATTR,
    STATS_ATTR,
    DataError,
    iso,
)
from gridtnp.files import is_url, remove_path
from gridtnp.redaction import redact

ZARR_FORMAT = 2  # readable by zarr-python 2 and 3 (and most other Zarr readers); v3 adds nothing needed here


def is_zarr_store(path: Path) -> bool:
    """Whether ``path`` is a directory holding Zarr (v2 or v3) metadata at its root."""
    return path.is_dir() and any((path / name).exists() for name in ("zarr.json", ".zgroup", ".zmetadata"))


def is_prepared_store(path: Path) -> bool:
    """Whether ``path`` is a store ``gridtnp data prepare`` wrote (its root attributes hold the statistics)."""
    attrs = path / ".zattrs"
    try:
        return STATS_ATTR in json.loads(attrs.read_text())
    except (OSError, ValueError):
        return False


def remove_leftovers(out: Path) -> None:
    """Delete temporaries of earlier runs into ``out`` that were killed before their rename (``.<name>.tmp-*``)."""
    for leftover in out.parent.glob(f".{out.name}.tmp-*"):
        remove_path(leftover)


def to_float32(ds: xr.Dataset) -> xr.Dataset:
    """float32 data variables with the source's NetCDF/GRIB encoding (packing, fill values, chunks) dropped."""
    ds = ds.copy()
    for name in ds.data_vars:
        ds[name] = ds[name].astype(np.float32)
    for var in ds.variables.values():
        var.encoding = {}
    return ds


def as_written(source: xr.Dataset, coarsen: int = 1) -> xr.Dataset:
    """The opened inputs as prepare writes them: float32 (``to_float32``), averaged over ``coarsen x coarsen`` blocks
    of grid points (NaN-aware; coordinates the blocks' centres; a partial block at the end of an axis dropped)."""
    if coarsen < 1:
        raise DataError(f"--coarsen {coarsen}: expected a positive number of grid points per block.")
    ds = to_float32(source)
    if coarsen > min(ds.sizes["latitude"], ds.sizes["longitude"]):
        raise DataError(
            f"--coarsen {coarsen}: the grid has {ds.sizes['latitude']} latitudes x {ds.sizes['longitude']} longitudes "
            "(after --region), and partial blocks are dropped; expected a block of at most "
            f"{min(ds.sizes['latitude'], ds.sizes['longitude'])} points a side."
        )
    if coarsen > 1:
        ds = ds.coarsen(latitude=coarsen, longitude=coarsen, boundary="trim").mean(keep_attrs=True)
    return ds


def stats_attr(stats: dict[str, dict[str, Any]], train: xr.Dataset, inputs: Sequence[Any]) -> dict[str, Any]:
    first, last = iso(train.time.values[0]), iso(train.time.values[-1])
    out = {}
    for v, computed in stats.items():
        mean, std = float(computed["mean"]), float(computed["std"])
        if not (np.isfinite(mean) and np.isfinite(std)):
            raise DataError(
                f"{', '.join(map(str, inputs))}: variable {v!r} has no finite values between {first} and {last}; "
                "choose a training period with data (--train-start/--train-end)."
            )
        out[v] = {"mean": mean, "std": std, "train_start": first, "train_end": last, "steps": int(train.sizes["time"])}
        if "levels" in computed:
            levels, means, stds = computed["levels"]
            out[v]["levels"] = {
                f"{level:g}": {"mean": float(m), "std": float(sd)}
                for level, m, sd in zip(levels, np.asarray(means), np.asarray(stds), strict=True)
            }
    return out


def provenance_attr(
    inputs: Sequence[Any],
    out: Path,
    variables: Sequence[str] | None,
    start: str | None,
    end: str | None,
    steps: int,
    climatology: bool = False,
) -> dict[str, Any]:
    args = ["gridtnp", "data", "prepare", *map(str, inputs), "--out", str(out)]
    if variables:
        args += ["--variables", *variables]
    for flag, value in (("--train-start", start), ("--train-end", end)):
        if value is not None:
            args += [flag, str(value)]
    args += ["--time-chunk", str(steps)]
    if climatology:
        args.append("--climatology")
    try:
        version = metadata.version("gridtnp")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {
        "sources": [str(p) if is_url(p) else str(Path(p).resolve()) for p in inputs],
        "command": shlex.join(args),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "gridtnp_version": version,
    }


def finish_store(
    tmp: Path, stats: dict[str, Any], provenance: dict[str, Any], extra: dict[str, Any] | None = None
) -> None:
    """Add the gridtnp attributes (and ``extra`` ones) and consolidate the metadata (one read for remote copies)."""
    import zarr

    group = zarr.open_group(str(tmp), mode="r+")
    variables = [name for name in stats]  # the data variables (coordinates have no statistics)
    attrs = {STATS_ATTR: stats, PROVENANCE_ATTR: redact(provenance), CHUNKS_ATTR: inventory(tmp, variables)}
    group.attrs.update({**attrs, **(extra or {})})
    zarr.consolidate_metadata(str(tmp))


def check_target(out: Path, overwrite: bool) -> None:
    if not out.exists():
        if not out.parent.is_dir():
            raise DataError(f"--out {out}: the folder {out.parent} does not exist; create it first.")
        return
    if not overwrite:
        raise DataError(
            f"--out {out} already exists; pass --overwrite to replace it (the new store is written next to it "
            "first, so the old one stays intact if preparation fails)."
        )
    if not is_zarr_store(out):
        raise DataError(f"--out {out} exists and is not a Zarr store; refusing to replace it. Choose another path.")
    if not is_prepared_store(out):
        raise DataError(
            f"--out {out} is a Zarr store that gridtnp data prepare did not write (e.g. predictions); refusing to "
            "replace it even with --overwrite. Choose another path."
        )


def zarr_major() -> int:
    return int(metadata.version("zarr").split(".")[0])


def size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6
