"""Chunks of a local Zarr v2 store read from their files (``ChunkFiles``): the values zarr reads, and zarr where the
store is one they do not read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr

from gridtnp.data.chunk_cache import ChunkCache
from gridtnp.data.chunk_files import ChunkFiles
from gridtnp.data.prepare import prepare

HOURS, CHUNK = 10, 4  # the last chunk holds 2 steps


def small_store(tmp: Path, space_chunk: int | None = None) -> str:
    """A prepared store of ``u [time, level, latitude, longitude]`` and ``t2m [time, latitude, longitude]`` with a
    NaN, in chunks of ``CHUNK`` steps."""
    rng = np.random.default_rng(0)
    lat, lon, levels = np.arange(50.0, 53.01, 0.5), np.arange(-2.0, 2.01, 0.5), np.array([500.0, 850.0])
    u = rng.standard_normal((HOURS, 2, lat.size, lon.size)).astype(np.float32)
    t2m = rng.standard_normal((HOURS, lat.size, lon.size)).astype(np.float32)
    t2m[3, 2, 1] = np.nan
    ds = xr.Dataset(
        {"u": (("time", "level", "lat", "lon"), u), "t2m": (("time", "lat", "lon"), t2m)},
        coords={"time": pd.date_range("2020-01-01", periods=HOURS, freq="h"), "level": levels, "lat": lat, "lon": lon},
    )
    ds.to_netcdf(tmp / "source.nc")
    out = prepare(
        [tmp / "source.nc"], tmp / "store.zarr", train_end="2020-01-01", time_chunk=CHUNK, space_chunk=space_chunk,
        progress=False,
    )  # fmt: skip
    return str(out)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    return small_store(tmp_path_factory.mktemp("chunk_files"))


@pytest.mark.parametrize("region", [{}, {"latitude": slice(1, 5), "longitude": slice(2, 7)}])
def test_chunk_files_read_what_zarr_reads(store: str, region: dict[str, slice]) -> None:
    cache = ChunkCache(store, capacity=8, variables=["u", "t2m"], region=region)
    steps = np.array([0, 3, 4, 7, 8, 9, 2])  # every chunk, the short last one, out of order
    fields = cache.read([("u", steps), ("t2m", steps)])
    stored = xr.open_zarr(store).isel(region)
    for name, field in zip(["u", "t2m"], fields, strict=True):
        assert cache.chunk_files(name) is not None  # read from the files, not through zarr
        expected = stored[name].isel(time=steps).values
        assert field.dtype == np.float32 and np.array_equal(field, expected, equal_nan=True)
    if not region:
        assert np.isnan(fields[1]).sum() == 1  # the store's NaN, as stored
    assert cache.reads == 2 * 3 and cache.bytes_read == sum(stored[v].nbytes for v in ("u", "t2m"))


def test_an_unwritten_chunk_holds_the_fill_value(store: str, tmp_path: Path) -> None:
    var = xr.open_zarr(store)["t2m"]
    files = ChunkFiles.of(store, "t2m", var.dims, var.shape, {})
    assert files is not None
    copy = tmp_path / "t2m"
    for path in Path(store, "t2m").iterdir():
        copy.joinpath(path.name).parent.mkdir(exist_ok=True)
        copy.joinpath(path.name).write_bytes(path.read_bytes())
    (copy / "1.0.0").unlink()
    files.folder = copy
    expected = zarr.open_array(str(copy), mode="r")[CHUNK : 2 * CHUNK]
    assert np.isnan(expected).all() and np.array_equal(files.read(CHUNK, 2 * CHUNK), expected, equal_nan=True)
    with pytest.raises(ValueError, match="span more than chunk 0"):
        files.read(2, CHUNK + 1)


def test_stores_chunked_in_space_or_by_url_are_read_by_zarr(store: str, tmp_path: Path) -> None:
    tiled = small_store(tmp_path, space_chunk=4)
    cache = ChunkCache(tiled, capacity=4, variables=["t2m"])
    assert cache.chunk_files("t2m") is None
    assert np.array_equal(cache.read([("t2m", np.array([5]))])[0], xr.open_zarr(tiled)["t2m"][5:6].values)
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    for path in Path(store).rglob("*"):
        if path.is_file():
            fs.pipe(f"/chunk_files/store.zarr/{path.relative_to(store).as_posix()}", path.read_bytes())
    remote = ChunkCache("memory://chunk_files/store.zarr", capacity=4, variables=["u"])
    assert remote.chunk_files("u") is None
    assert np.array_equal(remote.read([("u", np.array([9]))])[0], xr.open_zarr(store)["u"][9:10].values)


def test_packed_or_masked_variables_are_read_by_xarray(tmp_path: Path) -> None:
    # A user's store written by xarray with CF encoding: int16 with scale_factor / add_offset, and a float whose fill
    # value is a number. xarray unpacks and masks them; raw chunk files would give the stored integers and fills.
    values = np.array([[[271.25, 272.5], [273.75, np.nan]]] * 4, dtype=np.float32)  # [time, lat, lon]
    ds = xr.Dataset(
        {"t2m": (("time", "latitude", "longitude"), values), "skt": (("time", "latitude", "longitude"), values)},
        coords={"time": pd.date_range("2020-01-01", periods=4, freq="h"), "latitude": [50.0, 51.0],
                "longitude": [0.0, 1.0]},
    )  # fmt: skip
    encoding = {
        "t2m": {"dtype": "int16", "scale_factor": 0.25, "add_offset": 270.0, "_FillValue": -32768},
        "skt": {"_FillValue": -999.0},
    }
    ds.to_zarr(tmp_path / "packed.zarr", encoding=encoding, zarr_format=2, consolidated=True)
    cache = ChunkCache(str(tmp_path / "packed.zarr"), capacity=4, variables=["t2m", "skt"])
    steps = np.array([0, 3])
    for name, field in zip(["t2m", "skt"], cache.read([("t2m", steps), ("skt", steps)]), strict=True):
        assert cache.chunk_files(name) is None
        assert np.array_equal(field, values[steps], equal_nan=True)  # unpacked, the fill masked to NaN


def test_a_node_local_cache_copies_each_chunk_file_once_and_serves_later_reads(store: str, tmp_path: Path) -> None:
    # Two processes of one node: the first copies the chunk files it reads into the local folder, the second reads
    # them from there, even once the store's own files are broken.
    shared = tmp_path / "shared.zarr"
    for path in Path(store).rglob("*"):
        if path.is_file():
            shared.joinpath(path.relative_to(store)).parent.mkdir(parents=True, exist_ok=True)
            shared.joinpath(path.relative_to(store)).write_bytes(path.read_bytes())
    local = str(tmp_path / "node")
    steps = np.array([0, 5, 9])
    expected = xr.open_zarr(store)["t2m"].isel(time=steps).values
    first = ChunkCache(str(shared), capacity=4, variables=["t2m"], local_cache=local)
    assert np.array_equal(first.read([("t2m", steps)])[0], expected, equal_nan=True)
    assert (first.chunk_files("t2m").copied, first.chunk_files("t2m").reused) == (3, 0)
    for chunk in Path(shared, "t2m").glob("[0-9]*"):
        chunk.write_bytes(b"not a chunk")
    second = ChunkCache(str(shared), capacity=4, variables=["t2m"], local_cache=local)
    assert np.array_equal(second.read([("t2m", steps)])[0], expected, equal_nan=True)
    assert (second.chunk_files("t2m").copied, second.chunk_files("t2m").reused) == (0, 3)
    assert not [p for p in Path(local).rglob(".*") if p.is_file()]  # no partial copies left behind


def test_a_local_cache_on_a_store_zarr_reads_says_so(tmp_path: Path) -> None:
    tiled = small_store(tmp_path, space_chunk=4)
    cache = ChunkCache(tiled, capacity=4, variables=["t2m"], local_cache=str(tmp_path / "node"))
    with pytest.warns(UserWarning, match=r"store.local_cache: 't2m' of .* is read through zarr .* 'simplecache::'"):
        assert cache.chunk_files("t2m") is None


def test_store_local_cache_gives_the_same_training_batches(tmp_path: Path) -> None:
    from gridtnp.data.datamodules import generator_from
    from gridtnp.data.sections import StoreConfig
    from gridtnp.registry import ConfigError
    from tests.data.test_era5_multisource import make_store
    from tests.data.test_tasks_per_read import assert_same, multisource

    multi = make_store(tmp_path)
    plain, cached = multisource(multi), multisource(multi, local_cache=str(tmp_path / "node"))
    assert cached.task.cache.local_cache == str(tmp_path / "node")
    for i in range(2):
        assert_same(
            plain.split_task("train").sample(8, generator_from(0, "train", i)),
            cached.split_task("train").sample(8, generator_from(0, "train", i)),
        )
    assert any(p.is_file() for p in (tmp_path / "node").rglob("*"))
    with pytest.raises(ConfigError, match=r"store\.local_cache must be a folder path or null; got ''"):
        StoreConfig(local_cache="")


def test_a_url_store_caches_on_the_node_through_fsspec_simplecache(store: str, tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    for path in Path(store).rglob("*"):
        if path.is_file():
            fs.pipe(f"/simplecache/store.zarr/{path.relative_to(store).as_posix()}", path.read_bytes())
    local = tmp_path / "node"
    options = {"simplecache": {"cache_storage": str(local)}}
    cache = ChunkCache(
        "simplecache::memory://simplecache/store.zarr", capacity=4, variables=["u"], storage_options=options
    )
    assert np.array_equal(cache.read([("u", np.array([9]))])[0], xr.open_zarr(store)["u"][9:10].values)
    assert any(local.iterdir())  # the chunk files read went to the node's folder
