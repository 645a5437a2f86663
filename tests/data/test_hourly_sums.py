"""The writer's statistics: the hourly climatology sums (float64 sums of float32 blocks, per-point counts only for
variables with gaps; the stored means equal a float64 reference up to float32 rounding, across blocks and a
checkpoint) and the running mean and std per variable and level."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from gridtnp.data.prepare import statistics
from gridtnp.data.prepare.statistics import HourlySums, RunningMoments


def _data(steps: int = 24 * 5) -> xr.Dataset:
    rng = np.random.default_rng(0)
    t2m = (280.0 + 30.0 * rng.standard_normal((steps, 6, 7))).astype(np.float32)
    sst = (290.0 + 5.0 * rng.standard_normal((steps, 6, 7))).astype(np.float32)
    sst[:, 0, 0] = np.nan  # land: never a value
    sst[rng.random(sst.shape) < 0.2] = np.nan
    time = pd.date_range("2020-01-01", periods=steps, freq="h")
    dims = ("time", "latitude", "longitude")
    return xr.Dataset({"t2m": (dims, t2m), "sst": (dims, sst)}, coords={"time": time})


def _fold(sums: HourlySums, ds: xr.Dataset, start: int, stop: int, block: int) -> None:
    hours = ds.indexes["time"].hour.to_numpy()
    for a in range(start, stop, block):
        b = min(a + block, stop)
        for i, v in enumerate(ds.data_vars):
            sums.add(str(v), ds[v].values[a:b], hours[a:b], count_steps=i == 0)


def test_stored_means_are_the_float64_reference_rounded_to_float32() -> None:
    ds = _data()
    sums = HourlySums({str(v): ds[v].shape[1:] for v in ds.data_vars})
    _fold(sums, ds, 0, ds.sizes["time"], block=7)  # blocks that straddle days
    assert set(sums.missing) == {"sst"}  # no per-point counts for a variable without gaps
    means = sums.means(ds)
    assert sums.sums == {}  # released once taken
    hours = ds.indexes["time"].hour.to_numpy()
    for v in ("t2m", "sst"):
        x = ds[v].values.astype(np.float64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the all-NaN point
            reference = np.stack([np.nanmean(x[hours == h], axis=0) for h in range(24)])
        assert means[v].dtype == np.float32
        assert np.isnan(means[v].values[:, 0, 0]).all() if v == "sst" else not np.isnan(means[v].values).any()
        # Tolerance: float32 rounding of the float64 mean (half a unit in the last place, 2**-24 relative).
        np.testing.assert_allclose(means[v].values, reference, rtol=2.0**-24, atol=0, equal_nan=True)


def test_a_checkpoint_restores_the_sums_and_counts() -> None:
    ds = _data()
    shapes = {str(v): ds[v].shape[1:] for v in ds.data_vars}
    whole = HourlySums(shapes)
    _fold(whole, ds, 0, 120, block=12)
    first = HourlySums(shapes)
    _fold(first, ds, 0, 60, block=12)
    buffer = io.BytesIO()
    np.savez(buffer, **first.arrays())
    buffer.seek(0)
    resumed = HourlySums(shapes)
    with np.load(buffer) as saved:
        resumed.load(saved)
    _fold(resumed, ds, 60, 120, block=12)
    a, b = whole.means(ds), resumed.means(ds)
    for v in ("t2m", "sst"):
        np.testing.assert_array_equal(a[v].values, b[v].values)


@pytest.mark.parametrize("gaps", [False, True])
def test_running_moments_equal_the_float64_reference_per_level(monkeypatch: pytest.MonkeyPatch, gaps: bool) -> None:
    # Pieces smaller than a block and cache-sized passes smaller than a piece: every merge path is taken.
    monkeypatch.setattr(statistics, "MOMENT_ELEMENTS", 3 * 5 * 7)
    monkeypatch.setattr(statistics, "SQUARES_ELEMENTS", 16)
    rng = np.random.default_rng(1)
    values = (250.0 + 20.0 * rng.standard_normal((40, 3, 5, 7)) + 10.0 * np.arange(3)[:, None, None]).astype(np.float32)
    if gaps:
        values[rng.random(values.shape) < 0.3] = np.nan
    per_level, pooled = RunningMoments(3), RunningMoments(1)
    finite = [per_level.add(values[a : a + 9], level_axis=1) for a in range(0, 40, 9)]
    for a in range(0, 40, 9):
        pooled.add(values[a : a + 9], level_axis=None)
    assert all(finite) is not gaps
    reference = np.moveaxis(values, 1, 0).reshape(3, -1).astype(np.float64)
    mean, std = per_level.result()
    np.testing.assert_allclose(mean, np.nanmean(reference, axis=1), rtol=1e-12)
    np.testing.assert_allclose(std, np.nanstd(reference, axis=1), rtol=1e-10)
    np.testing.assert_allclose(pooled.result()[1], [np.nanstd(reference)], rtol=1e-10)
