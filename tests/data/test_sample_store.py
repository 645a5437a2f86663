"""The embedded sample's store is made without the prepare pipeline, and equals what ``gridtnp data prepare`` writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import xarray as xr

from gridtnp.data.prepare import prepare
from gridtnp.data.sample import sample_path
from gridtnp.data.sample.store import write_sample_store


def test_the_readers_never_import_the_writer(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from gridtnp.data import StationReanalysisDataModule as S, MultiSourceDataModule as M\n"
        "S(loader={'batch_size': 2}).setup(); M(loader={'batch_size': 2}).setup()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[-1] in ('prepare', 'writer', 'append', 'output_store')))\n"
    )
    env = {"GRIDTNP_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, timeout=300)
    assert out.stdout.strip() == "[]"
    assert (tmp_path / "era5_t2m_uk_2019-03.zarr").is_dir()


def test_the_sample_store_equals_the_prepared_one(tmp_path: Path) -> None:
    train = ("2019-03-02", "2019-03-20")
    prepared = xr.open_zarr(prepare([sample_path()], tmp_path / "p.zarr", None, *train, progress=False))
    written = xr.open_zarr(write_sample_store(tmp_path / "w.zarr", train))
    by_hand = xr.open_dataset(sample_path()).t2m.sel(time=slice("2019-03-02", "2019-03-20T23")).values
    stats = written.attrs["gridtnp_stats"]["t2m"]
    assert stats["steps"] == 19 * 24
    assert (stats["train_start"], stats["train_end"]) == ("2019-03-02T00:00:00", "2019-03-20T23:00:00")
    np.testing.assert_allclose([stats["mean"], stats["std"]], [by_hand.astype(np.float64).mean(), by_hand.std()],
                               rtol=1e-6)  # fmt: skip
    reference = prepared.attrs["gridtnp_stats"]["t2m"]  # prepare sums in blocks: equal to rounding
    np.testing.assert_allclose([stats["mean"], stats["std"]], [reference["mean"], reference["std"]], rtol=1e-12)
    assert {k: v for k, v in stats.items() if k not in ("mean", "std")} == {
        k: v for k, v in reference.items() if k not in ("mean", "std")
    }
    assert written.attrs["gridtnp_chunks"] == prepared.attrs["gridtnp_chunks"]
    np.testing.assert_array_equal(written.t2m.values, prepared.t2m.values)
    for axis in ("time", "latitude", "longitude"):
        np.testing.assert_array_equal(written[axis].values, prepared[axis].values)
    assert written.latitude.attrs == prepared.latitude.attrs and written.t2m.attrs == prepared.t2m.attrs
    assert written.t2m.encoding["chunks"] == prepared.t2m.encoding["chunks"] == (24, 33, 49)
