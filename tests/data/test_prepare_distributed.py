"""``gridtnp data prepare --scheduler``: the reading runs on a dask.distributed cluster (a LocalCluster here) and the
store is, chunk for chunk, the one a local run writes."""

from __future__ import annotations

from pathlib import Path

import pytest
import xarray as xr

from gridtnp.data.climatology import CLIMATOLOGY_GROUP
from gridtnp.data.layout import STATS_ATTR
from gridtnp.data.prepare import prepare
from tests.data.test_prepare_append import write

distributed = pytest.importorskip("distributed")


def test_prepare_on_a_local_cluster_equals_the_local_run(tmp_path: Path) -> None:
    files = [write(tmp_path / "a.nc", 0, 50), write(tmp_path / "b.nc", 50, 110)]
    kwargs = {"train_end": "2020-01-03", "time_chunk": 12, "block_steps": 36, "climatology": True, "progress": False}
    local = prepare(files, tmp_path / "local.zarr", **kwargs)
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
    ) as cluster:
        remote = prepare(files, tmp_path / "cluster.zarr", scheduler=cluster.scheduler_address, **kwargs)
    a, b = xr.open_zarr(local), xr.open_zarr(remote)
    xr.testing.assert_identical(a.drop_attrs(), b.drop_attrs())
    assert a.attrs[STATS_ATTR] == b.attrs[STATS_ATTR]
    xr.testing.assert_identical(
        xr.open_zarr(local, group=CLIMATOLOGY_GROUP), xr.open_zarr(remote, group=CLIMATOLOGY_GROUP)
    )
    for chunk in sorted(p.name for p in (local / "t2m").iterdir() if not p.name.startswith(".")):
        assert (local / "t2m" / chunk).read_bytes() == (remote / "t2m" / chunk).read_bytes()
