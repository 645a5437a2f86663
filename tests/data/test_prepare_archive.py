"""``gridtnp data prepare`` from an archive in the ARCO-ERA5 layout, served over HTTP from localhost and read through
fsspec: archive and short names, one pressure level, dates, a region (across the date line too), levels; the
store equals one prepared from the same values as NetCDF."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from gridtnp.cli import main
from gridtnp.data.archive import resolve
from gridtnp.data.layout import STATS_ATTR, DataError
from gridtnp.data.prepare import data_main, prepare
from gridtnp.data.prepare.append import append
from gridtnp.data.store import open_store
from tests.http_server import LocalHTTPServer

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
    command = ds.attrs["gridtnp_provenance"]["command"]
    assert "--region -20 20 140 -160 --levels 850 500" in command
    rerun = tmp_path / "rerun.zarr"
    main([*shlex.split(command.replace(str(out), str(rerun)))[1:], "--quiet"])  # the recorded command runs as it is
    assert_same_store(out, rerun)


def test_archive_names_are_checked(archive: tuple[Path, Path], tmp_path: Path) -> None:
    zarr_store, _ = archive
    with pytest.raises(DataError, match=r"no variable 'tp'; available: 2m_temperature \(t2m\)"):
        prepare([zarr_store], tmp_path / "x.zarr", variables=["tp"], progress=False)
    with pytest.raises(DataError, match=r"no level 700"):
        prepare([zarr_store], tmp_path / "x.zarr", variables=["u700"], progress=False)
    with pytest.raises(DataError, match=r"has no level dimension"):
        prepare([zarr_store], tmp_path / "x.zarr", variables=["t2m@850"], progress=False)


@pytest.mark.parametrize("source", ["zarr", "netcdf"])
def test_levels_a_request_cannot_take_are_refused(archive: tuple[Path, Path], source: str, tmp_path: Path) -> None:
    """A missing level names the levels there are (the archive's axis, before the cut to the request), and
    ``--levels`` that no variable takes is refused instead of ignored."""
    path = archive[0] if source == "zarr" else archive[1]
    with pytest.raises(DataError, match=r"'u_component_of_wind': no level 300, 700 in level \(it has 500, 850, 1000\)"):
        prepare([path], tmp_path / "x.zarr", variables=["u"], levels=[850, 300, 700], progress=False)
    for variables in (["t2m"], ["u850", "skt"]):
        with pytest.raises(DataError, match=r"--levels 850: none of the variables .* takes them"):
            prepare([path], tmp_path / "x.zarr", variables=variables, levels=[850], progress=False)
    out = prepare([path], tmp_path / "ok.zarr", variables=["u850", "u"], levels=[500], progress=False)
    ds = open_store(out)
    assert ds.u850.dims == ("time", "latitude", "longitude") and ds.u.level.values.tolist() == [500]


def test_options_out_of_range_are_refused(archive: tuple[Path, Path], tmp_path: Path) -> None:
    zarr_store, _ = archive
    out = tmp_path / "x.zarr"
    with pytest.raises(DataError, match=r"--coarsen 7: the grid has 5 latitudes x 18 longitudes .* at most 5 points"):
        prepare([zarr_store], out, variables=["t2m"], region="-30,30,-180,180", coarsen=7, progress=False)
    with pytest.raises(DataError, match=r"--jobs 0: expected at least 1"):
        prepare([zarr_store], out, variables=["t2m"], jobs=0, progress=False)
    assert not out.exists()
    store = prepare([zarr_store], tmp_path / "s.zarr", variables=["t2m"], end="2020-01-01", progress=False)
    with pytest.raises(DataError, match=r"--jobs -1: expected at least 1"):
        append([zarr_store], store, jobs=-1, progress=False)


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


@pytest.fixture(scope="module")
def padded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The replica as ARCO-ERA5 publishes it: the time axis runs on past the data (no chunks there: they read as
    NaN), and the attributes say where final ERA5 and preliminary ERA5T end."""
    ds = replica()
    pad = ds.isel(time=slice(0, 48)).assign_coords(time=ds.time.values[-1] + np.arange(1, 49) * np.timedelta64(1, "h"))
    ds = xr.concat([ds, xr.full_like(pad, np.nan)], "time")
    ds.attrs = {
        "valid_time_start": "2020-01-01",
        "valid_time_stop": "2020-01-02",
        "valid_time_stop_era5t": "2020-01-03",
    }
    encoding = {v: {"chunks": (1, *ds[v].shape[1:])} for v in ds.data_vars}
    path = tmp_path_factory.mktemp("padded") / "arco.zarr"
    ds.to_zarr(path, encoding=encoding, consolidated=True, zarr_format=2)
    assert len(list((path / "2m_temperature").glob("*.0.0"))) == HOURS  # the padding has no chunk files
    return path


def test_the_archive_period_bounds_the_request(padded: Path, tmp_path: Path) -> None:
    out = prepare([padded], tmp_path / "final.zarr", variables=["t2m"], progress=False)
    ds = open_store(out)
    assert ds.sizes["time"] == 48 and str(ds.time.values[-1]).startswith("2020-01-02T23")  # final ERA5 only
    assert bool(np.isfinite(ds.t2m.values).all())
    with pytest.warns(UserWarning, match="preliminary ERA5T"):
        out = prepare([padded], tmp_path / "era5t.zarr", variables=["t2m"], end="2020-01-03", progress=False)
    assert open_store(out).sizes["time"] == HOURS
    held = r"holds data from 2020-01-01 to 2020-01-02 \(preliminary ERA5T to 2020-01-03\)"
    with pytest.raises(DataError, match=rf"--end 2020-01-04: .*{held}; its later hours are empty"):
        prepare([padded], tmp_path / "x.zarr", variables=["t2m"], end="2020-01-04", progress=False)
    with pytest.raises(DataError, match=rf"--start 2019-12-31: .*{held}"):
        prepare([padded], tmp_path / "x.zarr", variables=["t2m"], start="2019-12-31", progress=False)


def test_append_from_the_archive_keeps_the_store_region_levels_and_blocks(padded: Path, tmp_path: Path) -> None:
    """A regional, coarsened store of a level variable grown by a day from the archive over HTTP: the same store as
    one prepare of both days; the region, levels and block size come from the store."""
    options = {"variables": ["t2m", "u"], "levels": [850, 500], "region": "-50,50,-40,60", "coarsen": 2}
    once = prepare([padded], tmp_path / "once.zarr", train_end="2020-01-01", progress=False, **options)
    grown = prepare([padded], tmp_path / "grown.zarr", end="2020-01-01", progress=False, **options)
    with LocalHTTPServer(padded.parent) as server:
        main(["data", "prepare", server.url(padded.name), "--out", str(grown), "--append", "--quiet"])
    assert_same_store(once, grown)
    ds = open_store(grown)
    assert ds.sizes == {"time": 48, "level": 2, "latitude": 3, "longitude": 3}
    assert open_store(grown).attrs["gridtnp_provenance"]["appended"][0]["end"] == "2020-01-02T23:00:00"
    with pytest.raises(DataError, match=r"--append takes the store's variables.*drop --variables"):
        data_main(["prepare", str(padded), "--out", str(grown), "--append", "--variables", "t2m", "--quiet"])


def century_archive(
    path: Path, start: str, lat: np.ndarray, lon: np.ndarray, variables: dict[str, bool], levels: np.ndarray = LEVELS
) -> Any:
    """A Zarr group in the ARCO-ERA5 layout with a century of hourly steps from ``start``, metadata only (one step per
    chunk, none written; consolidated): ``variables`` maps names to whether they have a level dimension. The data
    chunks a test writes are its own."""
    import zarr

    steps = 24 * 365 * 100
    group = zarr.open_group(path, mode="w", zarr_format=2)
    for name, values, attrs in (
        ("time", np.arange(steps, dtype=np.int64), {"units": f"hours since {start}"}),
        ("latitude", lat, {"units": "degrees_north"}),
        ("longitude", lon, {"units": "degrees_east"}),
        ("level", levels, {"units": "millibars"}),
    ):
        array = group.create_array(name, shape=values.shape, dtype=values.dtype, chunks=values.shape, fill_value=None)
        array[:] = values
        array.attrs.update({"_ARRAY_DIMENSIONS": [name], **attrs})
    for name, with_level in variables.items():
        dims = ["time", *(["level"] if with_level else []), "latitude", "longitude"]
        shape = (steps, *([len(levels)] if with_level else []), len(lat), len(lon))
        array = group.create_array(name, shape=shape, dtype="float32", chunks=(1, *shape[1:]), fill_value=np.nan)
        array.attrs["_ARRAY_DIMENSIONS"] = dims
    zarr.consolidate_metadata(path, zarr_format=2)
    return group


def test_an_archive_is_cut_before_it_is_chunked(tmp_path: Path) -> None:
    """A century of hourly steps, metadata only: a day of one level of it opens as a task graph of that day, not of
    the whole axis (which took minutes and gigabytes for ARCO-ERA5's 1.3 M steps)."""
    from gridtnp.data.prepare.inputs import Selection, open_sources

    path = tmp_path / "century.zarr"
    century_archive(path, "1950-01-01", LAT, LON, {"u_component_of_wind": True})
    ds = open_sources([path], ["u850"], 1, Selection(start="2000-01-01", end="2000-01-01"))
    assert ds.sizes["time"] == 24 and ds.u850.dims == ("time", "latitude", "longitude")
    assert len(ds.u850.data.__dask_graph__()) < 50 * 24  # tasks of one day's 24 steps


def test_only_the_levels_read_are_kept_before_chunking() -> None:
    from gridtnp.data.archive import level_indices

    raw = replica()
    picks = resolve(raw, ["u850", "u@500", "t2m"], "arco")
    assert level_indices(raw, picks, None) == {"level": [0, 1]}  # 500 and 850 in stored order; t2m has no level
    assert level_indices(raw, resolve(raw, ["u"], "arco"), [1000, 850]) == {"level": [1, 2]}
    assert level_indices(raw, resolve(raw, ["u", "u850"], "arco"), None) == {}  # u whole: every level
