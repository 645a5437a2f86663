"""``gridtnp data prepare --append``: a store extended with later months equals a one-shot prepare of the whole
period (statistics kept, or recomputed on request)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from gridtnp.cli import main
from gridtnp.data.climatology import CLIMATOLOGY_GROUP
from gridtnp.data.layout import STATS_ATTR, DataError
from gridtnp.data.prepare import prepare
from gridtnp.data.prepare.append import append


def write(path: Path, start: int, stop: int) -> Path:
    time_axis = pd.date_range("2020-01-01", periods=stop, freq="h")[start:]
    rng = np.random.default_rng(start)
    values = rng.normal(280.0, 5.0, size=(stop - start, 5, 7)).astype(np.float32)
    ds = xr.Dataset(
        {"t2m": (("time", "latitude", "longitude"), values, {"units": "K"})},
        coords={"time": time_axis, "latitude": np.arange(5.0), "longitude": np.arange(7.0)},
    )
    ds.to_netcdf(path)
    return path


def test_append_equals_a_one_shot_prepare(tmp_path: Path) -> None:
    first, second = write(tmp_path / "a.nc", 0, 50), write(tmp_path / "b.nc", 50, 110)  # 50 steps: not whole chunks
    kwargs = {"train_end": "2020-01-02", "time_chunk": 12, "climatology": True, "progress": False}
    once = prepare([first, second], tmp_path / "once.zarr", **kwargs)
    grown = prepare([first], tmp_path / "grown.zarr", **kwargs)
    main(["data", "prepare", str(second), "--out", str(grown), "--append", "--quiet"])
    a, b = xr.open_zarr(once), xr.open_zarr(grown)
    xr.testing.assert_identical(a.drop_attrs(), b.drop_attrs())
    assert a.attrs[STATS_ATTR] == b.attrs[STATS_ATTR]
    xr.testing.assert_identical(
        xr.open_zarr(once, group=CLIMATOLOGY_GROUP), xr.open_zarr(grown, group=CLIMATOLOGY_GROUP)
    )
    assert (
        b.attrs["gridtnp_chunks"] == a.attrs["gridtnp_chunks"] and len(b.attrs["gridtnp_provenance"]["appended"]) == 1
    )
    with pytest.raises(DataError, match="no time step after the store's last step"):
        append([second], grown, progress=False)
    # Recomputed over a longer training period: the statistics of a one-shot prepare with that period.
    main(["data", "prepare", str(first), "--out", str(tmp_path / "r.zarr"), "--train-end", "2020-01-02", "--quiet"])
    main(["data", "prepare", str(second), "--out", str(tmp_path / "r.zarr"), "--append", "--recompute-stats",
          "--train-end", "2020-01-04", "--quiet"])  # fmt: skip
    whole = prepare([first, second], tmp_path / "w.zarr", train_end="2020-01-04", progress=False)
    got, want = xr.open_zarr(tmp_path / "r.zarr").attrs[STATS_ATTR], xr.open_zarr(whole).attrs[STATS_ATTR]
    assert got["t2m"]["train_end"] == want["t2m"]["train_end"] == "2020-01-04T23:00:00"
    np.testing.assert_allclose(got["t2m"]["mean"], want["t2m"]["mean"], rtol=1e-12)
    np.testing.assert_allclose(got["t2m"]["std"], want["t2m"]["std"], rtol=1e-10)
