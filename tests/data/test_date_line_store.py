"""A store of a box across the date line (prepared with ``--region`` LON_MIN > LON_MAX, stored as two runs of
longitudes): the DataModules read it as one run past 180 degrees, with the values, stations and stored climatology
of the points they name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr

from gridtnp.data import MultiSourceDataModule, StationReanalysisDataModule
from gridtnp.data.climatology import computed_climatology
from gridtnp.data.layout import DataError
from gridtnp.data.prepare import prepare
from gridtnp.data.sections import from_flat_arguments
from gridtnp.data.store import date_line_order, open_store, unwrapped_region
from tests.data.test_era5 import unnormalise

LAT = np.arange(-30.0, 30.1, 10.0)  # 7
LON = np.arange(-180.0, 180.0, 10.0)  # 36: a global grid
HOURS = 96
DATES = {
    "train_dates": ("2020-01-01", "2020-01-02"),
    "val_dates": ("2020-01-03", "2020-01-03"),
    "test_dates": ("2020-01-04", "2020-01-04"),
}


def expected_t2m(lat: np.ndarray, lon: np.ndarray, hour: np.ndarray) -> np.ndarray:
    """The field, a function of the point (longitude taken mod 360) and the hour since the first."""
    return 250.0 + lat + 0.1 * np.mod(lon, 360.0) + 0.01 * hour


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A global NetCDF file prepared whole, with its hourly climatology."""
    tmp = tmp_path_factory.mktemp("date_line")
    time = pd.date_range("2020-01-01", periods=HOURS, freq="h")
    hour, lat, lon = np.meshgrid(np.arange(HOURS), LAT, LON, indexing="ij")
    t2m = expected_t2m(lat, lon, hour).astype(np.float32)
    ds = xr.Dataset(
        {"t2m": (("time", "latitude", "longitude"), t2m), "skt": (("time", "latitude", "longitude"), t2m + 5)},
        coords={"time": time, "latitude": LAT, "longitude": LON},
    )
    ds.to_netcdf(tmp / "global.nc")
    return str(
        prepare([tmp / "global.nc"], tmp / "world.zarr", train_end="2020-01-02", climatology=True, progress=False)
    )


@pytest.fixture(scope="module")
def pacific(world: str) -> str:
    """The box 20 S to 20 N, 150 E to 170 W of the global store, prepared as a store of its own."""
    out = Path(world).with_name("pacific.zarr")
    return str(
        prepare([world], out, region="-20,20,150,-170", train_end="2020-01-02", climatology=True, progress=False)
    )


def test_the_store_is_two_runs_and_reads_as_one(pacific: str, world: str) -> None:
    stored = open_store(pacific)
    assert stored["longitude"].values.tolist() == [-180.0, -170.0, 150.0, 160.0, 170.0]
    ds = open_store(pacific, continuous=True)
    assert ds["longitude"].values.tolist() == [150.0, 160.0, 170.0, 180.0, 190.0]
    np.testing.assert_array_equal(ds["t2m"].sel(longitude=190.0).values, stored["t2m"].sel(longitude=-170.0).values)
    assert date_line_order(LON) is None and date_line_order(np.array([0.0, 10.0, 30.0, 40.0])) is None
    rolled = open_store(world, continuous=True, west=150.0)["longitude"].values
    assert rolled[:4].tolist() == [150.0, 160.0, 170.0, 180.0] and rolled[-1] == 500.0 and len(rolled) == len(LON)
    assert open_store(pacific, continuous=True, west=150.0)["longitude"].values[-1] == 190.0  # regional: as it is
    assert unwrapped_region((0, 1, 140, -160)) == unwrapped_region((0, 1, 140, 200)) == (0.0, 1.0, 140.0, 200.0)
    assert unwrapped_region((0, 1, 180, -170)) == (0.0, 1.0, -180.0, -170.0)
    assert unwrapped_region((0, 1, -10, 2)) == (0.0, 1.0, -10.0, 2.0)


def test_station_tasks_on_the_store_see_one_run_of_longitudes(pacific: str, tmp_path: Path) -> None:
    stations = tmp_path / "stations.csv"
    rows = [(0.0, 160.0), (10.0, -170.0), (-10.0, 180.0), (20.0, 170.0), (-20.0, 190.0 - 360.0), (0.0, 100.0)]
    pd.DataFrame(rows, columns=["latitude", "longitude"]).to_csv(stations, index=False)
    dm = from_flat_arguments(
        StationReanalysisDataModule,
        store=pacific,
        stations=str(stations),
        coarsen=1,
        climatology=True,
        batch_size=3,
        **DATES,
    )
    dm.setup()
    assert dm.box[1].tolist() == [150.0, 160.0, 170.0, 180.0, 190.0]
    assert dm.task.cache.reads == 0  # the stored climatology was read, not a pass over the training hours
    computed = computed_climatology(dm.open(["t2m"]), ["t2m"], dm.splits["train"].target_time, "test")
    np.testing.assert_allclose(dm.task.climatology["t2m"], computed["t2m"], rtol=1e-6)
    assert dm.describe().startswith("5 stations of 6 in stations.csv (1 outside the store, 0 sharing")
    plain = from_flat_arguments(
        StationReanalysisDataModule, store=pacific, stations=str(stations), coarsen=1, batch_size=3, **DATES
    )
    batch = plain.split_task("train").sample(3, torch.Generator().manual_seed(0))
    x_t, ok = batch.target.x.double().numpy(), batch.target.mask.numpy()
    assert x_t[ok][:, 1].min() >= 150.0 and x_t[ok][:, 1].max() <= 190.0
    want = expected_t2m(x_t[..., 0], x_t[..., 1], batch.extras["hour"].numpy()[:, None])
    np.testing.assert_allclose(unnormalise(plain, batch.target.y[..., 0])[ok], want[ok], atol=1e-3)
    box = from_flat_arguments(
        StationReanalysisDataModule,
        store=pacific,
        stations=str(stations),
        coarsen=1,
        region=(-10.0, 10.0, 175.0, 190.0),
        **DATES,
    )
    box.setup()
    assert box.box[1].tolist() == [180.0, 190.0] and len(box.station_table) == 2


def test_multisource_windows_on_the_store_see_one_run_of_longitudes(pacific: str) -> None:
    dm = from_flat_arguments(
        MultiSourceDataModule, store=pacific, variables=["t2m", "skt"], target_variables=["t2m"], window=2, **DATES
    )
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    x = batch.context["skt"].x[batch.context["skt"].mask].double().numpy()
    assert x[:, 2].min() >= 150.0 and x[:, 2].max() <= 190.0 and (x[:, 2] > 180.0).any()


def test_a_region_across_the_date_line_of_a_global_store_is_its_own_store(world: str, pacific: str) -> None:
    """``region=(-20, 20, 150, -170)`` on the global store reads the columns from 150 E eastward: the same tasks,
    stations and stored climatology as the box prepared as a store of its own."""
    station_file = Path(world).with_name("stations.csv")
    rows = [(0.0, 160.0), (10.0, -170.0), (-10.0, 180.0), (20.0, 170.0), (0.0, 100.0), (0.0, -100.0)]
    pd.DataFrame(rows, columns=["latitude", "longitude"]).to_csv(station_file, index=False)
    common = {"stations": str(station_file), "coarsen": 2, "climatology": True, "batch_size": 3, **DATES}
    common["stats"] = {"t2m": (250.0, 10.0)}  # the stores' own differ: one over the globe, one over the box
    whole = from_flat_arguments(StationReanalysisDataModule, store=world, region=(-20.0, 20.0, 150.0, -170.0), **common)
    box = from_flat_arguments(StationReanalysisDataModule, store=pacific, **common)
    whole.setup(), box.setup()
    assert whole.box[1].tolist() == box.box[1].tolist() == [150.0, 160.0, 170.0, 180.0, 190.0]
    in_0_360 = from_flat_arguments(
        StationReanalysisDataModule, store=world, region=(-20.0, 20.0, 150.0, 190.0), **common
    )
    in_0_360.setup()
    assert in_0_360.box[1].tolist() == whole.box[1].tolist()
    assert whole.task.cache.reads == 0  # the stored climatology of the global store, its region's columns
    np.testing.assert_array_equal(whole.task.climatology["t2m"], box.task.climatology["t2m"])
    assert whole.describe().replace("the region", "the store") == box.describe()
    for split in ("train", "test"):
        a = whole.split_task(split).sample(3, torch.Generator().manual_seed(1))
        b = box.split_task(split).sample(3, torch.Generator().manual_seed(1))
        for name in ("grid", "stations"):
            torch.testing.assert_close(a.context[name].x, b.context[name].x)
            torch.testing.assert_close(a.context[name].y, b.context[name].y)
        torch.testing.assert_close(a.target.y, b.target.y)
    ms = {"variables": ["t2m", "skt"], "target_variables": ["t2m"], "window": 2, **DATES}
    ms["stats"] = {"t2m": (250.0, 10.0), "skt": (255.0, 10.0)}
    a = from_flat_arguments(MultiSourceDataModule, store=world, region=(-20.0, 20.0, 150.0, -170.0), **ms)
    b = from_flat_arguments(MultiSourceDataModule, store=pacific, **ms)
    a.setup(), b.setup()
    batch_a = a.split_task("train").sample(2, torch.Generator().manual_seed(0))
    batch_b = b.split_task("train").sample(2, torch.Generator().manual_seed(0))
    torch.testing.assert_close(batch_a.context["skt"].x, batch_b.context["skt"].x)
    torch.testing.assert_close(batch_a.context["skt"].y, batch_b.context["skt"].y)


def test_a_region_with_lon_min_above_lon_max_on_a_regional_store_reads_it_past_180(pacific: str) -> None:
    dm = from_flat_arguments(
        StationReanalysisDataModule, store=pacific, coarsen=1, region=(-10.0, 10.0, 170.0, -170.0), **DATES
    )
    dm.setup()
    assert dm.box[1].tolist() == [170.0, 180.0, 190.0]
    with pytest.raises(DataError, match=r"lon 170 to 195 reaches outside the store, .* longitude 150 to 190"):
        from_flat_arguments(
            StationReanalysisDataModule, store=pacific, coarsen=1, region=(-10.0, 10.0, 170.0, -165.0), **DATES
        ).setup()
