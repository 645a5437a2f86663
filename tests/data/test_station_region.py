"""The station DataModule on a region of its store: grid, stations and climatology of the box only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gridtnp.data.layout import DataError
from tests.data.test_era5 import datamodule, expected_t2m, unnormalise


def test_a_region_restricts_grid_stations_and_reads(store: str, stations: str) -> None:
    region = (50.5, 51.5, -0.5, 0.5)
    dm = datamodule(store, stations, region=region, coarsen=1, climatology=True)
    lat, lon = dm.box
    assert lat.tolist() == [50.5, 50.75, 51.0, 51.25, 51.5] and lon.tolist() == [-0.5, -0.25, 0.0, 0.25, 0.5]
    inside = dm.station_table
    assert len(inside) >= 2
    assert inside.latitude.between(50.5, 51.5).all() and inside.longitude.between(-0.5, 0.5).all()
    assert dm.task.cache.dataset().sizes["latitude"] == 5 and dm.task.cache.dataset().sizes["longitude"] == 5
    assert dm.task.climatology["t2m"].shape == (24, 25)
    batch = dm.split_task("train").sample(3, torch.Generator().manual_seed(0))
    grid = batch.context["grid"]
    x = grid.x[grid.mask].double().numpy()
    assert x[:, 0].min() >= 50.5 and x[:, 0].max() <= 51.5 and x[:, 1].min() >= -0.5 and x[:, 1].max() <= 0.5
    # Without the climatology, targets are the field at the station's point and hour.
    plain = datamodule(store, stations, region=region, coarsen=1)
    batch = plain.split_task("train").sample(3, torch.Generator().manual_seed(0))
    hours = batch.extras["hour"].numpy()[:, None]
    x_t, ok = batch.target.x.double().numpy(), batch.target.mask.numpy()
    want = expected_t2m(x_t[..., 0], x_t[..., 1], hours)
    np.testing.assert_allclose(unnormalise(plain, batch.target.y[..., 0])[ok], want[ok], atol=1e-3)
    with pytest.raises(DataError, match="reaches outside the store"):
        datamodule(store, stations, region=(40.0, 51.0, -0.5, 0.5))
    with pytest.raises(DataError, match=r"holds 1 latitude\(s\) x 5 longitude\(s\) .* at least 2 grid points"):
        datamodule(store, stations, region=(50.5, 50.6, -0.5, 0.5), coarsen=1)
    with pytest.raises(DataError, match=r"0 distinct station\(s\) inside region \[51\.5, 51\.75, -0\.25, 0\.0\] of"):
        datamodule(store, stations, region=(51.5, 51.75, -0.25, 0.0), coarsen=1)
