"""``gridtnp data prepare --climatology`` stores the hourly climatology; the station DataModule's setup reads it
instead of the training period (reads counted on a store served over HTTP)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gridtnp.data.climatology import CLIMATOLOGY_ATTR
from gridtnp.data.prepare import prepare
from gridtnp.data.store import open_store
from tests.data.test_era5 import CHUNK, DATES, datamodule, field, write_stations
from tests.http_server import LocalHTTPServer


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("clim")
    source = tmp / "source.nc"
    field().to_netcdf(source)
    kwargs = {"train_start": DATES["train_dates"][0], "train_end": DATES["train_dates"][1], "time_chunk": CHUNK}
    plain = prepare([source], tmp / "plain.zarr", progress=False, **kwargs)
    with_clim = prepare([source], tmp / "clim.zarr", progress=False, climatology=True, **kwargs)
    return plain, with_clim


@pytest.fixture(scope="module")
def stations(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_stations(tmp_path_factory.mktemp("stations") / "stations.csv")


def test_stored_climatology_equals_the_computed_one_and_setup_reads_no_training_data(
    stores: tuple[Path, Path], stations: str
) -> None:
    plain, with_clim = stores
    record = open_store(with_clim).attrs[CLIMATOLOGY_ATTR]
    assert (
        record["train_start"] == "2020-01-01T00:00:00" and record["steps"] == 48 and record["hours"] == list(range(24))
    )
    np.testing.assert_array_equal(open_store(with_clim).t2m.values, open_store(plain).t2m.values)
    computed = datamodule(str(plain), stations, climatology=True, grid_variables=["t2m", "skt"]).task.climatology
    with LocalHTTPServer(with_clim.parent) as server:
        dm = datamodule(server.url(with_clim.name), stations, climatology=True, grid_variables=["t2m", "skt"])
        data_reads = [r for r in server.requests if r.split("/")[2] in ("t2m", "skt")]
        assert data_reads == []  # the variables' chunks: none read by setup
        assert any("/climatology/t2m/" in r for r in server.requests)
    for v in ("t2m", "skt"):
        np.testing.assert_allclose(dm.task.climatology[v], computed[v], rtol=0, atol=2e-5)
    # Other training dates than the stored period: computed from the store, as before.
    other = datamodule(str(with_clim), stations, climatology=True, train_dates=("2020-01-02", "2020-01-02"))
    np.testing.assert_allclose(
        other.task.climatology["t2m"], field().t2m.values[24:48].reshape(24, -1), rtol=0, atol=2e-5
    )


def test_a_batch_fetches_its_chunks_concurrently_each_once(stores: tuple[Path, Path]) -> None:
    from gridtnp.data.chunk_cache import ChunkCache

    _, store = stores
    with LocalHTTPServer(store.parent, latency=0.05) as server:
        cache = ChunkCache(server.url(store.name), capacity=64, variables=["t2m", "skt"])
        cache.dataset()
        before = len(server.requests)
        hours = np.arange(0, 96, 5)  # 20 hours in 16 chunks of 6 steps, per variable
        fields = cache.read([("t2m", hours), ("skt", hours)])
        got = [r for r in server.requests[before:] if r.split("/")[2] in ("t2m", "skt")]
        assert len(got) == len(set(got)) == 32 and cache.reads == 32  # every chunk once
        assert server.most_in_flight > 1
        want = open_store(store)
        np.testing.assert_array_equal(fields[0], want.t2m.values[hours])
        np.testing.assert_array_equal(fields[1], want.skt.values[hours])
        cache.read([("t2m", hours[:3])])
        assert cache.reads == 32 and len(server.requests) == before + 32  # served from memory
