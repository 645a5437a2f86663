"""Data preparation: NetCDF -> Zarr (`gridtnp data prepare`), prepared-store checks, station CSVs and snapping."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr

from gridtnp.cli import main
from gridtnp.data import sample_path
from gridtnp.data.chunk_cache import ChunkCache
from gridtnp.data.layout import STATS_ATTR, DataError, normalise
from gridtnp.data.prepare import prepare
from gridtnp.data.prepare.append import append as prepare_append
from gridtnp.data.prepare.inputs import _step_chunks
from gridtnp.data.prepare.writer import BlockReader
from gridtnp.data.sample import ERA5_SAMPLE, STATIONS_SAMPLE
from gridtnp.data.stations import read_stations, snap_to_grid
from gridtnp.data.store import normalisation_stats, open_store, select
from gridtnp.registry import ConfigError

TRAIN = ("2019-03-01", "2019-03-21")


@pytest.fixture(scope="module")
def sample_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped ERA5 sample prepared once for the module."""
    out = tmp_path_factory.mktemp("store") / "uk.zarr"
    return prepare([sample_path(ERA5_SAMPLE)], out, train_start=TRAIN[0], train_end=TRAIN[1], progress=False)


def synthetic(lat: np.ndarray, lon: np.ndarray, steps: int = 6, names: tuple[str, str, str] = ("time", "lat", "lon")):
    """``t2m [time, lat, lon] = 1000 lat + lon (wrapped to [-180, 180)) + hours``: values name their coordinates."""
    time = pd.date_range("2020-01-01", periods=steps, freq="h")
    wrapped = (lon + 180.0) % 360.0 - 180.0
    values = 1000.0 * lat[None, :, None] + wrapped[None, None, :] + np.arange(steps)[:, None, None]
    t, y, x = names
    return xr.Dataset(
        {"t2m": ((t, y, x), values.astype(np.float32), {"units": "K", "long_name": "2 metre temperature"})},
        coords={t: time, y: (y, lat, {"units": "degrees_north"}), x: (x, lon, {"units": "degrees_east"})},
    )


def write_nc(ds: xr.Dataset, path: Path) -> Path:
    ds.to_netcdf(path)
    return path


# --- embedded data ---------------------------------------------------------------------------------------------------


def test_sample_files_ship_with_the_package() -> None:
    for name in (ERA5_SAMPLE, STATIONS_SAMPLE):
        assert sample_path(name).is_file()
    assert (sample_path(ERA5_SAMPLE).parent / "README.md").is_file()
    with pytest.raises(ConfigError, match="Shipped samples"):
        sample_path("nope.nc")


# --- prepare ---------------------------------------------------------------------------------------------------------


def test_prepare_sample_layout_chunks_attrs_and_stats(sample_store: Path) -> None:
    src = xr.open_dataset(sample_path(ERA5_SAMPLE)).load()
    ds = xr.open_zarr(sample_store)
    lat, lon = ds.latitude.values, ds.longitude.values
    assert np.all(np.diff(lat) > 0) and lat[0] == 50.0 and lat[-1] == 58.0
    assert lon.min() >= -180 and lon.max() < 180 and np.all(np.diff(lon) > 0)
    assert np.issubdtype(ds.time.dtype, np.datetime64) and ds.sizes["time"] == 744
    assert ds.t2m.dtype == np.float32
    assert zarr.open_group(str(sample_store), mode="r")["t2m"].chunks == (24, 33, 49)
    assert ds.t2m.attrs["units"] == "K" and ds.t2m.attrs["long_name"] == "2 metre temperature"
    # Same values as the source, latitudes flipped.
    np.testing.assert_array_equal(ds.t2m.values, src.t2m.values[:, ::-1, :])

    train = src.t2m.sel(time=slice(*TRAIN)).values.astype(np.float64)
    assert train.shape[0] == 21 * 24
    stats = ds.attrs[STATS_ATTR]["t2m"]
    np.testing.assert_allclose(stats["mean"], train.mean(), rtol=1e-12)
    np.testing.assert_allclose(stats["std"], train.std(), rtol=1e-10)
    assert (stats["train_start"], stats["train_end"]) == ("2019-03-01T00:00:00", "2019-03-21T23:00:00")
    assert normalisation_stats(open_store(sample_store), "t2m") == (stats["mean"], stats["std"])
    provenance = ds.attrs["gridtnp_provenance"]
    assert provenance["sources"] == [str(sample_path(ERA5_SAMPLE).resolve())]
    assert (
        provenance["command"].startswith("gridtnp data prepare ") and "--train-end 2019-03-21" in provenance["command"]
    )


def test_rerun_refuses_without_overwrite_and_replaces_with_it(tmp_path: Path) -> None:
    lat, lon = np.array([0.0, 1.0]), np.array([0.0, 1.0, 2.0])
    out = tmp_path / "s.zarr"
    prepare([write_nc(synthetic(lat, lon), tmp_path / "a.nc")], out, progress=False)
    with pytest.raises(DataError, match=r"already exists; pass --overwrite"):
        prepare([tmp_path / "a.nc"], out, progress=False)
    prepare([write_nc(synthetic(lat + 10, lon), tmp_path / "b.nc")], out, overwrite=True, progress=False)
    assert xr.open_zarr(out).latitude.values.tolist() == [10.0, 11.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.nc", "b.nc", "s.zarr"]  # no temporary stores left
    (tmp_path / "folder").mkdir()
    with pytest.raises(DataError, match="not a Zarr store; refusing"):
        prepare([tmp_path / "a.nc"], tmp_path / "folder", overwrite=True, progress=False)


def test_0_360_descending_latitude_input_is_normalised(tmp_path: Path) -> None:
    lat = np.array([10.0, 5.0, 0.0, -5.0])
    lon = np.array([0.0, 90.0, 180.0, 270.0])
    src = synthetic(lat, lon, names=("valid_time", "lat", "lon"))
    out = prepare([write_nc(src, tmp_path / "g.nc")], tmp_path / "g.zarr", time_chunk=4, progress=False)
    ds = open_store(out)
    assert ds.latitude.values.tolist() == [-5.0, 0.0, 5.0, 10.0]
    assert ds.longitude.values.tolist() == [-180.0, -90.0, 0.0, 90.0]
    expected = synthetic(ds.latitude.values, ds.longitude.values).t2m.values
    np.testing.assert_array_equal(ds.t2m.values, expected)
    assert ds.t2m.encoding["chunks"] == (4, 4, 4)
    assert ds.latitude.attrs["units"] == "degrees_north" and ds.longitude.attrs["units"] == "degrees_east"


@pytest.mark.parametrize("lon", [[0.0, 90.0, 180.0, 270.0], [90.0, 0.0, 270.0, 180.0]], ids=["rotated", "shuffled"])
def test_normalise_flips_and_rotates_dask_arrays_as_sorting_does(tmp_path: Path, lon: list[float]) -> None:
    src = synthetic(np.array([10.0, 5.0, 0.0, -5.0]), np.array(lon), names=("valid_time", "lat", "lon"))
    with xr.open_dataset(write_nc(src, tmp_path / "g.nc")) as lazy:
        want = normalise(src)
        for opened in (lazy, lazy.chunk({"valid_time": 1})):
            got = normalise(opened)
            assert (got.t2m.chunks is None) == (opened.t2m.chunks is None)  # dask stays dask
            xr.testing.assert_identical(got.load(), want)


@pytest.mark.parametrize("stored", [1, 4])
def test_inputs_are_read_a_stored_chunk_per_block(tmp_path: Path, stored: int) -> None:
    # One dask block per stored chunk: a block of fewer steps would decompress the chunk once per block.
    src = synthetic(np.array([0.0, 5.0]), np.array([0.0, 90.0]), steps=8, names=("valid_time", "lat", "lon"))
    path = tmp_path / "g.nc"
    src.to_netcdf(path, encoding={"t2m": {"zlib": True, "chunksizes": (stored, 2, 2)}})
    with xr.open_dataset(path) as raw:
        assert _step_chunks(raw).t2m.chunks[0] == (stored,) * (src.sizes["valid_time"] // stored)


def test_block_reader_reads_what_dask_computes_and_only_whole_blocks() -> None:
    base = da.arange(6 * 4 * 8, chunks=4 * 8, dtype=np.float32).reshape(6, 4, 8)  # one step a block
    rolled = da.roll(base[:, ::-1], 3, axis=2)  # two blocks in longitude, tasks shared with `base`
    merged = rolled.rechunk((2, 4, 8))
    reader = BlockReader([base.rechunk((2, 4, 8)), merged], dask.local.get_sync)
    for a, b in [(0, 2), (2, 6), (0, 6)]:
        got = reader.read(a, b)
        want = dask.compute(base[a:b], merged[a:b], scheduler="sync")
        assert got is not None and all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    assert reader.read(1, 3) is None and reader.read(4, 7) is None  # not on block boundaries: the caller computes


def test_files_split_in_time_combine(tmp_path: Path) -> None:
    src = synthetic(np.array([0.0, 1.0]), np.array([350.0, 355.0]), steps=8)
    files = [
        write_nc(src.isel(time=slice(4, 8)), tmp_path / "b.nc"),
        write_nc(src.isel(time=slice(0, 4)), tmp_path / "a.nc"),
    ]
    ds = xr.open_zarr(prepare(files, tmp_path / "ab.zarr", train_end="2020-01-01T03", progress=False))
    assert ds.sizes["time"] == 8 and ds.longitude.values.tolist() == [-10.0, -5.0]
    first_half = src.t2m.isel(time=slice(0, 4)).values.astype(np.float64)
    np.testing.assert_allclose(ds.attrs[STATS_ATTR]["t2m"]["mean"], first_half.mean())
    overlapping = write_nc(src.isel(time=slice(0, 6)), tmp_path / "a6.nc")
    with pytest.raises(DataError, match=r"b\.nc starts at 2020-01-01T04:00:00, before .*a6\.nc ends at 2020-01-01T05"):
        prepare([overlapping, files[0]], tmp_path / "x.zarr", progress=False)
    shifted = write_nc(src.isel(time=slice(4, 8)).assign_coords(lat=[0.5, 1.5]), tmp_path / "c.nc")
    with pytest.raises(DataError, match=r"c\.nc: its latitude axis \(2 values, 0.5 to 1.5\) differs from .*a\.nc's"):
        prepare([files[1], shifted], tmp_path / "x.zarr", progress=False)


def test_a_gap_in_time_is_named_in_a_warning_when_preparing_and_appending(tmp_path: Path) -> None:
    """A daily file missing from the inputs (or between a store and what is appended to it) is a warning that names
    the missing hours; an unbroken axis gives none."""
    src = synthetic(np.array([0.0, 1.0]), np.array([0.0, 5.0]), steps=72)
    days = [write_nc(src.isel(time=slice(24 * d, 24 * d + 24)), tmp_path / f"day{d}.nc") for d in range(3)]
    gap = r"skips 24 steps of 1 h in 1 gap\(s\): 2020-01-02T00:00 to 2020-01-02T23:00 \(24 steps\)"
    with pytest.warns(UserWarning, match=r"2 input\(s\) from .*day0\.nc: the time axis " + gap):
        prepare([days[0], days[2]], tmp_path / "gap.zarr", progress=False)
    store = prepare([days[0]], tmp_path / "append.zarr", progress=False)
    with pytest.warns(UserWarning, match=r"append\.zarr and 1 input\(s\) appended: the time axis " + gap):
        prepare_append([days[2]], store)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepare(days, tmp_path / "whole.zarr", progress=False)


def test_bad_inputs_name_the_file_and_what_was_expected(tmp_path: Path) -> None:
    good = write_nc(synthetic(np.array([0.0, 1.0]), np.array([0.0, 1.0])), tmp_path / "good.nc")
    with pytest.raises(DataError, match=r"good\.nc: no variable 'u10'; available: t2m"):
        prepare([good], tmp_path / "x.zarr", variables=["u10"], progress=False)

    text = tmp_path / "notes.nc"
    text.write_text("not a netcdf file\n")
    with pytest.raises(DataError, match=r"notes\.nc: cannot be read .*Expected a NetCDF"):
        prepare([text], tmp_path / "x.zarr", progress=False)

    truncated = tmp_path / "truncated.nc"
    truncated.write_bytes(sample_path(ERA5_SAMPLE).read_bytes()[:200_000])
    with pytest.raises(DataError, match=r"truncated\.nc: cannot be read .*truncated or corrupt"):
        prepare([truncated], tmp_path / "x.zarr", progress=False)

    with pytest.raises(DataError, match=r"missing\.nc: no such file"):
        prepare([tmp_path / "missing.nc"], tmp_path / "x.zarr", progress=False)

    no_lat = write_nc(
        synthetic(np.array([0.0, 1.0]), np.array([0.0, 1.0]), names=("time", "y", "x")), tmp_path / "xy.nc"
    )
    with pytest.raises(DataError, match=r"xy\.nc: no latitude coordinate \(looked for latitude, lat"):
        prepare([no_lat], tmp_path / "x.zarr", progress=False)

    with pytest.raises(DataError, match=r"Dates from 2019-01-01 reach outside the store, which covers time 2020"):
        prepare([good], tmp_path / "x.zarr", train_start="2019-01-01", progress=False)
    assert not (tmp_path / "x.zarr").exists()


@pytest.mark.skipif(importlib.util.find_spec("cfgrib") is not None, reason="cfgrib is installed")
def test_final_era5_and_era5t_from_the_cds_are_merged(tmp_path: Path) -> None:
    """A CDS download across the end of final ERA5 has an expver dimension (1 final, 5 ERA5T), each step's values in
    one of them: one field, final first; points missing in both (sea surface temperature on land) stay missing."""
    time = pd.date_range("2024-01-30", periods=48, freq="h")
    lat, lon = np.arange(55.0, 49.9, -1.0), np.arange(0.0, 5.1, 1.0)
    values = np.full((48, 2, len(lat), len(lon)), np.nan, np.float32)
    values[:30, 0], values[30:, 1] = 280.0, 281.0  # final ERA5 ends at step 30
    values[:, :, 0, 0] = np.nan  # land
    ds = xr.Dataset(
        {"sst": (("time", "expver", "latitude", "longitude"), values, {"units": "K"})},
        coords={"time": time, "expver": np.array([1, 5], np.int32), "latitude": lat, "longitude": lon},
    )
    with pytest.warns(UserWarning, match=r"expver 5\) are merged"):
        out = prepare([write_nc(ds, tmp_path / "cds.nc")], tmp_path / "s.zarr", progress=False)
    got = open_store(out).sst
    assert got.dims == ("time", "latitude", "longitude") and got.attrs["units"] == "K"
    np.testing.assert_array_equal(got.values[:30, 0, 1:], 280.0)
    np.testing.assert_array_equal(got.values[30:, 0, 1:], 281.0)
    assert np.isnan(got.values[:, -1, 0]).all()  # latitudes ascending: the land point is the last row now
    with pytest.raises(DataError, match=r"expver dimension holds \[2, 5\]"):
        prepare([write_nc(ds.assign_coords(expver=[2, 5]), tmp_path / "x.nc")], tmp_path / "x.zarr", progress=False)


def test_grib_without_cfgrib_says_what_to_install(tmp_path: Path) -> None:
    grib = tmp_path / "era5.grib"
    grib.write_bytes(b"GRIB")
    with pytest.raises(DataError, match="pip install cfgrib eccodes"):
        prepare([grib], tmp_path / "x.zarr", progress=False)


def test_cli_data_prepare_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_nc(synthetic(np.array([0.0, 1.0, 2.0]), np.array([0.0, 1.0])), tmp_path / "in.nc")
    out = tmp_path / "out.zarr"
    main(["data", "prepare", str(src), "--out", str(out), "--time-chunk", "2", "--variables", "t2m"])
    assert "[4/4]" in capsys.readouterr().out
    ds = open_store(out, variables=["t2m"])
    assert ds.t2m.encoding["chunks"] == (2, 3, 2)
    with pytest.raises(SystemExit) as exit_info:
        main(["data", "prepare", str(src), "--out", str(out), "--quiet"])
    assert exit_info.value.code == 2
    assert "gridtnp: error: --out" in capsys.readouterr().err
    main(["data", "prepare", str(src), "--out", str(out), "--quiet", "--overwrite"])
    assert capsys.readouterr().out == ""


# --- open_store and select -------------------------------------------------------------------------------------------


def test_open_store_rejects_unprepared_stores(tmp_path: Path) -> None:
    descending = synthetic(np.array([5.0, 0.0]), np.array([0.0, 1.0]), names=("time", "latitude", "longitude"))
    descending.to_zarr(tmp_path / "desc.zarr", zarr_format=2)
    with pytest.raises(DataError, match=r"latitudes are descending.*gridtnp data prepare"):
        open_store(tmp_path / "desc.zarr")
    east = synthetic(np.array([0.0, 5.0]), np.array([0.0, 270.0]), names=("time", "latitude", "longitude"))
    east.to_zarr(tmp_path / "east.zarr", zarr_format=2)
    with pytest.raises(DataError, match=r"longitudes span 0.0 to 270.0; expected \[-180, 180\).*gridtnp data prepare"):
        open_store(tmp_path / "east.zarr")
    with pytest.raises(DataError, match=r"No Zarr store at .*gridtnp data prepare"):
        open_store(tmp_path / "missing.zarr")


@pytest.mark.skipif(importlib.util.find_spec("gcsfs") is not None, reason="gcsfs is installed")
def test_open_store_remote_without_gcsfs_says_what_to_install() -> None:
    with pytest.raises(DataError, match="needs gcsfs: pip install gcsfs"):
        open_store("gs://gcp-public-data-arco-era5/ar/full_37-1h-0p25deg-chunk-1.zarr-v3")


def test_open_store_variables(sample_store: Path) -> None:
    ds = open_store(sample_store, variables=["t2m"])
    assert ds.t2m.chunks[0][0] == 24  # lazily opened with the store's chunks
    with pytest.raises(DataError, match=r"no variable\(s\) 'u10'; available: t2m"):
        open_store(sample_store, variables=["u10"])


def test_select_subsets_and_names_the_coverage(sample_store: Path) -> None:
    ds = open_store(sample_store)
    sub = select(ds, "2019-03-02", "2019-03-03", region=(51.0, 52.0, -5.0, -4.0))
    assert dict(sub.sizes) == {"time": 48, "latitude": 5, "longitude": 5}
    assert select(ds, end="2019-03-31").sizes["time"] == 744
    coverage = r"time 2019-03-01T00:00:00 to 2019-03-31T23:00:00 \(744 steps\), latitude 50 to 58, longitude -10 to 2"
    with pytest.raises(DataError, match=coverage):
        select(ds, "2019-03-30", "2019-04-02")
    with pytest.raises(DataError, match=coverage):
        select(ds, "2019-02-27")
    with pytest.raises(DataError, match="Dates from 2019-04-01 reach outside the store, which covers " + coverage):
        select(ds, "2019-04-01")
    with pytest.raises(DataError, match="reaches outside the store, which covers " + coverage):
        select(ds, region=(45.0, 52.0, -5.0, 0.0))
    with pytest.raises(DataError, match="start 2019-03-05 is after end 2019-03-04"):
        select(ds, "2019-03-05", "2019-03-04")
    with pytest.raises(DataError, match="contains no grid point"):
        select(ds, region=(51.1, 51.2, -5.0, -4.0))


# --- stations --------------------------------------------------------------------------------------------------------


def test_shipped_stations_and_the_era5_box(sample_store: Path) -> None:
    ds = open_store(sample_store)
    assert len(read_stations(sample_path(STATIONS_SAMPLE))) == 9957
    stations = read_stations(sample_path(STATIONS_SAMPLE), ds.latitude.values, ds.longitude.values)
    assert len(stations) == 9957 and int(stations.inside.sum()) == 250  # as the data README says
    inside = stations[stations.inside]
    np.testing.assert_array_equal(ds.latitude.values[inside.lat_index], inside.latitude)
    np.testing.assert_array_equal(ds.longitude.values[inside.lon_index], inside.longitude)
    cells = set(zip(inside.lat_index, inside.lon_index, strict=True))
    assert int(inside.duplicate.sum()) == 250 - len(cells) > 0
    assert not stations[~stations.inside].duplicate.any()


def test_malformed_station_rows_are_named(tmp_path: Path) -> None:
    csv = tmp_path / "st.csv"
    csv.write_text("station_id,Lat,LON,t\na,50.0,-3.0,1\nb,abc,-3.0,2\n\nc,95.0,0.0,3\nd,51.0,400,4\n")
    with pytest.raises(DataError, match=r"st\.csv: 3 malformed row\(s\): line 3 \(latitude='abc'.*line 5 .*line 6 "):
        read_stations(csv)
    csv.write_text("id,x\n1,2\n")
    with pytest.raises(DataError, match=r"expected columns latitude and longitude .*found id, x"):
        read_stations(csv)


def test_station_aliases_0_360_and_values(tmp_path: Path) -> None:
    csv = tmp_path / "st.csv"
    csv.write_text("Station_ID,LAT,Lon,t2m\n007,50.0,350.0,281.5\n008,-10.0,180.0,300.0\n")
    st = read_stations(csv)
    assert st.station_id.tolist() == ["007", "008"]
    assert st.longitude.tolist() == [-10.0, -180.0] and st.t2m.tolist() == [281.5, 300.0]


@pytest.mark.parametrize(
    ("lat_axis", "lon_axis"),
    [
        (np.arange(49.0, 61.0, 0.5), np.arange(-12.0, 4.0, 0.5)),  # regional box
        (np.arange(61.0, 49.0, -0.5), np.arange(4.0, -12.0, -0.5)),  # descending axes
        (np.arange(-90.0, 90.1, 2.5), np.arange(-180.0, 180.0, 2.5)),  # global, longitude wraps
        (np.arange(-90.0, 90.1, 2.5), np.arange(0.0, 360.0, 2.5)),  # global 0-360 axis
    ],
)
def test_snap_to_grid_matches_brute_force_nearest(lat_axis: np.ndarray, lon_axis: np.ndarray) -> None:
    rng = np.random.default_rng(0)
    stations = pd.DataFrame({"latitude": rng.uniform(-90, 90, 2000), "longitude": rng.uniform(-180, 180, 2000)})
    stations.loc[:300, "latitude"] = rng.uniform(45, 65, 301)
    stations.loc[:300, "longitude"] = rng.uniform(-15, 8, 301)
    lat_i, lon_i, inside = snap_to_grid(stations, lat_axis, lon_axis)
    # Reference: nearest axis value by exhaustive search, longitudes compared on the circle.
    lat_ref = np.abs(stations.latitude.values[:, None] - lat_axis[None]).argmin(1)
    dlon = (stations.longitude.values[:, None] - lon_axis[None] + 180.0) % 360.0 - 180.0
    lon_ref = np.abs(dlon).argmin(1)
    half = abs(lat_axis[1] - lat_axis[0]) / 2
    lat_in = np.abs(stations.latitude.values - lat_axis[lat_ref]) <= half
    lon_in = np.abs(dlon[np.arange(len(stations)), lon_ref]) <= half
    assert inside.any() and (not inside.all() or np.isclose(len(lon_axis) * 2 * half, 360.0))
    np.testing.assert_array_equal(inside, lat_in & lon_in)
    np.testing.assert_array_equal(lat_i[inside], lat_ref[inside])
    np.testing.assert_array_equal(lon_i[inside], lon_ref[inside])


def test_automatic_time_chunks_keep_chunks_small_for_random_access() -> None:
    import dask.array as da

    from gridtnp.data.prepare.inputs import auto_time_chunk

    def grid(*shape: int) -> xr.Dataset:
        dims = (
            ("time", "level", "latitude", "longitude")[-len(shape) :]
            if len(shape) == 4
            else ("time", "latitude", "longitude")
        )
        return xr.Dataset({"v": (dims, da.zeros(shape, dtype=np.float32))})

    assert auto_time_chunk(grid(744, 33, 49)) == 24  # the embedded sample: a regional box
    assert auto_time_chunk(grid(8760, 721, 1440)) == 1  # global 0.25 degree: 4.0 MiB a step
    assert auto_time_chunk(grid(8760, 181, 360)) == 16  # global 1 degree
    assert auto_time_chunk(grid(8760, 37, 721, 1440)) == 1  # 37 pressure levels: one step per chunk


def test_a_store_missing_a_chunk_is_refused_at_open_naming_it(tmp_path: Path) -> None:
    lat, lon = np.array([0.0, 1.0]), np.array([0.0, 1.0, 2.0])
    out = prepare([write_nc(synthetic(lat, lon, steps=6), tmp_path / "a.nc")], tmp_path / "s.zarr", time_chunk=2,
                  progress=False)  # fmt: skip
    open_store(out)  # complete: opens
    (out / "t2m" / "1.0.0").unlink()  # deleted, or never copied
    with pytest.raises(DataError, match=r"s\.zarr: variable 't2m' has 2 of the 3 chunk files .* missing: 1\.0\.0"):
        open_store(out)


def test_a_corrupt_chunk_among_several_is_named_alone(tmp_path: Path) -> None:
    lat, lon = np.array([0.0, 1.0]), np.array([0.0, 1.0, 2.0])
    out = prepare([write_nc(synthetic(lat, lon, steps=6), tmp_path / "a.nc")], tmp_path / "s.zarr", time_chunk=2,
                  progress=False)  # fmt: skip
    chunk = out / "t2m" / "2.0.0"
    chunk.write_bytes(chunk.read_bytes()[:7])
    cache = ChunkCache(str(out), capacity=4, variables=["t2m"])
    with pytest.raises(DataError, match=r"'t2m' time chunks \[2\] failed"):
        cache.read([("t2m", np.arange(6))])  # chunks 0, 1 and 2 in one read


def test_prepare_never_replaces_a_store_it_did_not_write_and_cleans_leftovers(tmp_path: Path) -> None:
    lat, lon = np.array([0.0, 1.0]), np.array([0.0, 1.0, 2.0])
    nc = write_nc(synthetic(lat, lon), tmp_path / "a.nc")
    predictions = tmp_path / "pred.zarr"
    xr.Dataset({"mean": ("x", [1.0, 2.0])}, attrs={"source": "gridtnp predictions"}).to_zarr(predictions)
    with pytest.raises(DataError, match=r"did not write .* refusing to replace it even with --overwrite"):
        prepare([nc], predictions, overwrite=True, progress=False)
    assert xr.open_zarr(predictions)["mean"].values.tolist() == [1.0, 2.0]
    leftover = tmp_path / ".s.zarr.tmp-deadbeef"  # a prepare killed before its rename
    (leftover / "t2m").mkdir(parents=True)
    prepare([nc], tmp_path / "s.zarr", progress=False)
    assert not leftover.exists()


def test_latitudes_beyond_the_poles_are_refused(tmp_path: Path) -> None:
    nc = write_nc(synthetic(np.array([80.0, 100.0]), np.array([0.0, 1.0])), tmp_path / "polar.nc")
    with pytest.raises(DataError, match=r"latitude 100 is outside \[-90, 90\]"):
        prepare([nc], tmp_path / "s.zarr", progress=False)
    assert not (tmp_path / "s.zarr").exists()
