"""``gridtnp data prepare`` from an archive in the ARCO-ERA5 layout, served over HTTP from localhost and read through
fsspec: archive and short names, one pressure level, dates, a region (across the date line too), levels; the
store equals one prepared from the same values as NetCDF."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from gridtnp.cli import main
from gridtnp.data.http_server import LocalHTTPServer
from gridtnp.data.layout import STATS_ATTR, DataError
from gridtnp.data.prepare import prepare
from gridtnp.data.store import open_store

LAT = np.arange(90.0, -90.1, -15.0)  # 13, descending as in ARCO-ERA5
LON = np.arange(0.0, 360.0, 20.0)  # 18, 0 to 340
LEVELS = np.array([500, 850, 1000], dtype=np.int64)
HOURS = 72


def replica() -> xr.Dataset:
    """A small ARCO-ERA5 look-alike: its names, dimension order, descending latitudes, 0-360 longitudes, levels."""
    time = pd.date_range("2020-01-01", periods=HOURS, freq="h")
    rng = np.random.default_rng(0)
    shape = (HOURS, len(LAT), len(LON))
    t2m = 260.0 + 30 * np.cos(np.deg2rad(LAT))[None, :, None] + rng.normal(size=shape)
    wind = rng.normal(size=(HOURS, len(LEVELS), len(LAT), len(LON))) + LEVELS[None, :, None, None] / 100.0

    def attrs(name: str, units: str, standard: str) -> dict[str, str]:
        return {"long_name": name, "units": units, "standard_name": standard}

    return xr.Dataset(
        {
            "2m_temperature": (
                ("time", "latitude", "longitude"),
                t2m.astype(np.float32),
                attrs("2 metre temperature", "K", "unknown"),
            ),
            "skin_temperature": (
                ("time", "latitude", "longitude"),
                (t2m + 2).astype(np.float32),
                attrs("Skin temperature", "K", "unknown"),
            ),
            "u_component_of_wind": (
                ("time", "level", "latitude", "longitude"),
                wind.astype(np.float32),
                attrs("U component of wind", "m s**-1", "eastward_wind"),
            ),
        },
        coords={
            "time": ("time", time),
            "level": ("level", LEVELS, {"long_name": "pressure_level", "units": "millibars"}),
            "latitude": ("latitude", LAT, {"long_name": "latitude", "units": "degrees_north"}),
            "longitude": ("longitude", LON, {"long_name": "longitude", "units": "degrees_east"}),
        },
    )


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The replica as a Zarr store (one time step per chunk, consolidated) and as a NetCDF file."""
    tmp = tmp_path_factory.mktemp("archive")
    ds = replica()
    encoding = {v: {"chunks": (1, *ds[v].shape[1:])} for v in ds.data_vars}
    encoding["time"] = {"units": "hours since 1900-01-01", "dtype": "int64"}
    ds.to_zarr(tmp / "arco.zarr", encoding=encoding, consolidated=True, zarr_format=2)
    ds.to_netcdf(tmp / "arco.nc")
    return tmp / "arco.zarr", tmp / "arco.nc"


def assert_same_store(a: Path, b: Path) -> None:
    x, y = open_store(a), open_store(b)
    assert list(x.data_vars) == list(y.data_vars)
    xr.testing.assert_identical(x.drop_attrs(), y.drop_attrs())
    sa, sb = x.attrs[STATS_ATTR], y.attrs[STATS_ATTR]
    assert sa == sb


def test_prepare_over_http_equals_prepare_from_netcdf(archive: tuple[Path, Path], tmp_path: Path) -> None:
    zarr_store, nc = archive
    options = {
        "variables": ["2m_temperature", "skt", "u850"],
        "start": "2020-01-02",
        "end": "2020-01-03",
        "region": "-50,50,-40,60",
        "train_end": "2020-01-02",
        "progress": False,
    }
    with LocalHTTPServer(zarr_store.parent, latency=0.01) as server:
        remote = prepare([server.url(zarr_store.name)], tmp_path / "remote.zarr", jobs=4, **options)
        assert any(r.endswith(".zmetadata") for r in server.requests)
    local = prepare([nc], tmp_path / "local.zarr", **{**options, "variables": ["t2m", "skin_temperature", "u@850"]})
    assert_same_store(remote, local)
    ds = open_store(remote)
    assert sorted(ds.data_vars) == ["skt", "t2m", "u850"] and ds.u850.dims == ("time", "latitude", "longitude")
    assert ds.latitude.values.tolist() == [-45.0, -30.0, -15.0, 0.0, 15.0, 30.0, 45.0]
    assert ds.longitude.values.tolist() == [-40.0, -20.0, 0.0, 20.0, 40.0, 60.0]
    assert ds.sizes["time"] == 48 and str(ds.time.values[0]) == "2020-01-02T00:00:00.000000000"
    src = replica().sel(time=slice("2020-01-02", "2020-01-03"))
    want = src["u_component_of_wind"].sel(level=850).sel(latitude=45.0, longitude=20.0).values
    np.testing.assert_array_equal(ds.u850.sel(latitude=45.0, longitude=20.0).values, want)
    assert ds.t2m.attrs["units"] == "K" and ds.u850.attrs["standard_name"] == "eastward_wind"
    stats = ds.attrs[STATS_ATTR]["t2m"]
    assert (stats["train_start"], stats["train_end"]) == ("2020-01-02T00:00:00", "2020-01-02T23:00:00")


def test_netcdf_over_http_by_byte_ranges_equals_the_local_files(archive: tuple[Path, Path], tmp_path: Path) -> None:
    _, nc = archive
    days = [tmp_path / f"day{d}.nc" for d in range(3)]
    full = xr.open_dataset(nc)
    for d, path in enumerate(days):  # daily NetCDF-4 files, as archives hand them out
        full.isel(time=slice(24 * d, 24 * (d + 1))).to_netcdf(path, engine="netcdf4")
    options = {"variables": ["t2m", "skt", "u850"], "train_end": "2020-01-02", "progress": False}
    with LocalHTTPServer(tmp_path, latency=0.005) as server:
        remote = prepare([server.url(p.name) for p in days], tmp_path / "remote.zarr", **options)
        assert server.requests and all(r.lstrip("/").startswith("day") for r in server.requests)
    local = prepare(days, tmp_path / "local.zarr", **options)
    assert_same_store(remote, local)
    with pytest.raises(DataError, match="NetCDF-4"), LocalHTTPServer(tmp_path) as server:
        (tmp_path / "text.nc").write_text("not a NetCDF file")
        prepare([server.url("text.nc")], tmp_path / "x.zarr", progress=False)


def test_date_line_region_levels_and_the_command_line(archive: tuple[Path, Path], tmp_path: Path) -> None:
    zarr_store, _ = archive
    out = tmp_path / "pacific.zarr"
    main(
        ["data", "prepare", str(zarr_store), "--out", str(out), "--variables", "u", "--levels", "850", "500",
         "--region", "-20", "20", "140", "-160", "--end", "2020-01-01", "--quiet"]
    )  # fmt: skip
    ds = open_store(out)
    assert ds.longitude.values.tolist() == [-180.0, -160.0, 140.0, 160.0]  # both sides of the date line, ascending
    assert ds.latitude.values.tolist() == [-15.0, 0.0, 15.0]
    assert ds.u.dims == ("time", "level", "latitude", "longitude") and ds.level.values.tolist() == [850, 500]
    src = replica()["u_component_of_wind"].isel(time=slice(0, 24))
    np.testing.assert_array_equal(
        ds.u.sel(level=500, latitude=0.0, longitude=-160.0).values, src.sel(level=500, latitude=0.0, longitude=200.0)
    )
    levels = ds.attrs[STATS_ATTR]["u"]["levels"]
    np.testing.assert_allclose(
        levels["500"]["mean"],
        src.sel(level=500, latitude=[15.0, 0.0, -15.0], longitude=[140.0, 160.0, 180.0, 200.0])
        .values.astype(np.float64)
        .mean(),
        rtol=1e-12,
    )
    assert "--region -20,20,140,-160" in ds.attrs["gridtnp_provenance"]["command"]


def test_archive_names_are_checked(archive: tuple[Path, Path], tmp_path: Path) -> None:
    zarr_store, _ = archive
    with pytest.raises(DataError, match=r"no variable 'tp'; available: 2m_temperature \(t2m\)"):
        prepare([zarr_store], tmp_path / "x.zarr", variables=["tp"], progress=False)
    with pytest.raises(DataError, match=r"no level 700"):
        prepare([zarr_store], tmp_path / "x.zarr", variables=["u700"], progress=False)
    with pytest.raises(DataError, match=r"has no level dimension"):
        prepare([zarr_store], tmp_path / "x.zarr", variables=["t2m@850"], progress=False)


def test_coarsen_and_spatial_chunks(archive: tuple[Path, Path], tmp_path: Path) -> None:
    _, nc = archive
    out = prepare([nc], tmp_path / "c.zarr", variables=["t2m"], coarsen=2, space_chunk=4, progress=False)
    ds = open_store(out)
    src = replica()["2m_temperature"].sortby("latitude")
    src = src.assign_coords(longitude=(src.longitude + 180) % 360 - 180).sortby("longitude")
    want = src.coarsen(latitude=2, longitude=2, boundary="trim").mean()
    assert ds.sizes["latitude"] == 6 and ds.sizes["longitude"] == 9
    np.testing.assert_allclose(ds.latitude.values, want.latitude.values)
    np.testing.assert_allclose(ds.t2m.values, want.values, rtol=1e-6)
    assert ds.t2m.encoding["chunks"] == (24, 4, 4)
