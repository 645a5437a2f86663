"""Multi-source spatio-temporal tasks (``MultiSourceDataModule``) and store reading, on small prepared stores."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr
import yaml

from gridtnp import NeuralProcessModule
from gridtnp.batch import Batch, Observations
from gridtnp.data import MultiSourceDataModule
from gridtnp.data.chunk_cache import ChunkCache
from gridtnp.data.era5.multisource import Source
from gridtnp.data.layout import DataError
from gridtnp.data.prepare import prepare
from gridtnp.data.sections import from_flat_arguments
from gridtnp.data.store import normalisation_stats, open_store
from gridtnp.nn.likelihoods import log_likelihood
from gridtnp.registry import ConfigError

ROOT = Path(__file__).resolve().parents[2]

LAT = np.arange(50.0, 53.01, 0.5)  # 7 points
LON = np.arange(-2.0, 2.01, 0.5)  # 9 points
LEVELS = np.array([500.0, 850.0])
HOURS = 72  # 2020-01-01 to 2020-01-03
CHUNK = 4
DATES = {
    "train_dates": ("2020-01-01", "2020-01-01"),
    "val_dates": ("2020-01-02", "2020-01-02"),
    "test_dates": ("2020-01-03", "2020-01-03"),
}


def u_field(level: np.ndarray, hour: np.ndarray, lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """The analytic ``u`` of the test store; ``v = -u`` and ``u10 = lat - 0.2 lon + 0.05 hour``."""
    return level / 10.0 + lat + 0.1 * lon + 0.01 * hour


def make_store(tmp: Path, nan: bool = False) -> str:
    time = pd.date_range("2020-01-01", periods=HOURS, freq="h")
    h, lev, la, lo = np.meshgrid(np.arange(HOURS), LEVELS, LAT, LON, indexing="ij")
    u = u_field(lev, h, la, lo).astype(np.float32)
    u10 = (la - 0.2 * lo + 0.05 * h)[:, 0].astype(np.float32)
    if nan:
        u10[:, 2, 3] = np.nan
    ds = xr.Dataset(
        {
            "u": (("time", "level", "lat", "lon"), u),
            "v": (("time", "level", "lat", "lon"), -u),
            "u10": (("time", "lat", "lon"), u10),
        },
        coords={"time": time, "level": LEVELS, "lat": LAT, "lon": LON},
    )
    ds.to_netcdf(tmp / "source.nc")
    out = prepare([tmp / "source.nc"], tmp / "store.zarr", train_end="2020-01-01", time_chunk=CHUNK, progress=False)
    return str(out)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_store(tmp_path_factory.mktemp("multisource"))


def datamodule(store: str, **kwargs) -> MultiSourceDataModule:
    args = {
        "variables": ["u@850", "v@850", "u@500", "u10"],
        "target_variables": ["u@850", "v@850"],
        "window": 3,
        "batch_size": 4,
        "train_batches": 3,
        "val_batches": 2,
        "test_batches": 2,
        **DATES,
        **kwargs,
    }
    dm = from_flat_arguments(MultiSourceDataModule, store=store, **args)
    dm.setup()
    return dm


def physical(dm: MultiSourceDataModule, y: torch.Tensor, variable: str, level: float | None) -> np.ndarray:
    mean, std = normalisation_stats(open_store(dm.store_path()), variable, level)
    return y.double().numpy() * std + mean


def test_values_match_the_store_at_each_point_of_the_window(store: str) -> None:
    dm = datamodule(store)
    assert dm.dim_y == {"u850": 1, "v850": 1, "u500": 1, "u10": 1} and dm.dim_x == 3
    assert dm.target_variables() == ["u850", "v850"]
    batch = next(iter(dm.train_dataloader()))
    start = batch.extras["start_hour"].numpy()[:, None]
    for name, level in [("u850", 850.0), ("u500", 500.0)]:
        obs = batch.context[name]
        x, m = obs.x.numpy(), obs.mask.numpy()
        expected = u_field(level, start + x[..., 0], x[..., 1], x[..., 2])
        np.testing.assert_allclose(physical(dm, obs.y[..., 0], "u", level)[m], expected[m], atol=1e-3)
    x, m = batch.target.x.numpy(), batch.target.mask.numpy()
    u = u_field(850.0, start + x[..., 0], x[..., 1], x[..., 2])
    np.testing.assert_allclose(physical(dm, batch.target.y[..., 0], "u", 850.0)[m], u[m], atol=1e-3)
    np.testing.assert_allclose(physical(dm, batch.target.y[..., 1], "v", 850.0)[m], -u[m], atol=1e-3)
    # Per-level statistics: the 500 hPa values are normalised with their own mean, not the pooled one.
    assert abs(batch.context["u500"].y[batch.context["u500"].mask].mean()) < 0.5  # pooled stats: about -1


def test_context_shares_targets_and_held_out_points(store: str) -> None:
    dm = datamodule(store, context_fraction=(0.1, 0.2), target_fraction=0.25)
    points = 3 * len(LAT) * len(LON)
    batch = dm.split_task("train").sample(8, torch.Generator().manual_seed(1))
    assert batch.target.x.shape == (8, round(0.25 * points), 3) and batch.target.mask.all()
    for name, obs in batch.context.items():
        counts = obs.mask.sum(1)
        assert (counts >= int(0.1 * points)).all() and (counts <= int(0.2 * points)).all(), name
    key = lambda x: set(map(tuple, x.tolist()))  # noqa: E731
    for b in range(8):
        targets = key(batch.target.x[b])
        for name in ("u850", "v850"):  # target variables never show a target point in their context
            assert not targets & key(batch.context[name].x[b][batch.context[name].mask[b]]), name
        assert len(key(batch.context["u10"].x[b])) == batch.context["u10"].x.shape[1]  # no point twice


def test_windows_lie_inside_their_split(store: str) -> None:
    dm = datamodule(store, window=5)
    time = pd.date_range("2020-01-01", periods=HOURS, freq="h")
    for split, (start, end) in zip(("train", "val", "test"), DATES.values(), strict=True):
        hours = time[dm.starts[split]]
        assert hours.min() >= pd.Timestamp(start) and hours.max() + pd.Timedelta(hours=4) <= pd.Timestamp(end) + (
            pd.Timedelta(hours=23)
        )
        assert len(dm.starts[split]) == 24 - 4
    batch = next(iter(dm.test_dataloader()))
    assert set(batch.context["u850"].x[..., 0].unique().tolist()) <= {0.0, 1.0, 2.0, 3.0, 4.0}
    assert dm.describe() == (
        "4 sources (u850, v850, u500, u10) on 7 x 9 grid points, windows of 5 hours; targets u850, v850; window "
        "starts: train 20, val 20, test 20"
    )


def test_nans_are_masked_and_never_reach_the_batch(tmp_path: Path) -> None:
    dm = datamodule(make_store(tmp_path, nan=True), target_variables=["u10"], context_fraction=(0.9, 0.9))
    batch = dm.split_task("train").sample(4, torch.Generator().manual_seed(0))
    hole = torch.tensor([LAT[2], LON[3]])
    at_hole = (batch.context["u10"].x[..., 1:] == hole).all(-1)
    assert at_hole.any() and not batch.context["u10"].mask[at_hole].any()
    assert not batch.target.mask[(batch.target.x[..., 1:] == hole).all(-1)].any()
    assert all(torch.isfinite(o.y).all() for o in [*batch.context.values(), batch.target])
    assert "target_scale" in batch.extras  # one target variable: physical-unit metrics are available


def test_region_restricts_points_and_reads(store: str) -> None:
    dm = datamodule(store, region=(50.5, 52.0, -1.0, 1.0))
    batch = dm.split_task("train").sample(2, torch.Generator().manual_seed(0))
    x = batch.target.x
    assert x[..., 1].min() >= 50.5 and x[..., 1].max() <= 52.0 and x[..., 2].min() >= -1.0 and x[..., 2].max() <= 1.0
    assert dm.task.x.shape[0] == 3 * 4 * 5
    fields = dm.task.cache.read([("u10", np.array([0]))])[0]
    assert fields.shape == (1, 4, 5)  # only the box is read from the store


def test_only_the_needed_time_chunks_are_read(store: str) -> None:
    dm = datamodule(store, cache_chunks=64)
    batch = dm.split_task("train").sample(4, torch.Generator().manual_seed(3))
    steps = batch.extras["start_hour"].numpy()[:, None] + np.arange(3)
    needed = {(v, int(c)) for v in ("u", "v", "u10") for c in np.unique(steps // CHUNK)}
    assert set(dm.task.cache.loaded) == needed and dm.task.cache.reads == len(needed)


def test_ranks_draw_distinct_training_windows_and_share_eval_sets(store: str) -> None:
    dms = [datamodule(store) for _ in range(2)]
    for rank, dm in enumerate(dms):
        dm.trainer = SimpleNamespace(current_epoch=0, global_rank=rank, world_size=2)
    train = [torch.cat([b.extras["start_hour"] for b in dm.train_dataloader()]) for dm in dms]
    assert not torch.equal(train[0], train[1])
    whole = iter(datamodule(store).val_dataloader())  # one rank: the whole validation set, in order
    for dm, expected in zip(dms, [next(whole), next(whole)], strict=True):  # rank r of 2 reads global batch r first
        first = next(iter(dm.val_dataloader()))
        assert torch.equal(first.target.x, expected.target.x) and torch.equal(first.target.y, expected.target.y)


def test_bad_specifications_name_what_to_fix(store: str) -> None:
    with pytest.raises(DataError, match=r"'u' has no level 700 .*500, 850"):
        datamodule(store, variables=["u@700"], target_variables=None)
    with pytest.raises(DataError, match=r"has levels .*'u@500'"):
        datamodule(store, variables=["u"], target_variables=None)
    with pytest.raises(DataError, match="no level dimension"):
        datamodule(store, variables=["u10@850"], target_variables=None)
    with pytest.raises(DataError, match="'nope'"):
        datamodule(store, variables=["nope"], target_variables=None)
    with pytest.raises(DataError, match="outside the store"):
        datamodule(store, region=(40.0, 52.0, -1.0, 1.0))
    with pytest.raises(DataError, match=r"hold no 30 consecutive hours"):
        datamodule(store, window=30)
    with pytest.raises(ConfigError, match=r"task.target_variables \[.t2m.\] must be a subset of task.variables"):
        from_flat_arguments(MultiSourceDataModule, store=store, variables=["u10"], target_variables=["t2m"])
    with pytest.raises(ConfigError, match="name@level"):
        from_flat_arguments(MultiSourceDataModule, store=store, variables=["u@high"])
    with pytest.raises(ConfigError, match="context_fraction"):
        from_flat_arguments(MultiSourceDataModule, store=store, variables=["u10"], context_fraction=(0.3, 0.1))


def test_a_store_opened_by_url_reads_lazily(store: str) -> None:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    root = Path(store)
    for path in root.rglob("*"):
        if path.is_file():
            fs.pipe(f"/remote/store.zarr/{path.relative_to(root).as_posix()}", path.read_bytes())
    dm = datamodule("memory://remote/store.zarr", variables=["u10"], target_variables=None)
    batch = dm.split_task("val").sample(2, torch.Generator().manual_seed(0))
    start = batch.extras["start_hour"].numpy()[:, None]
    x, m = batch.target.x.numpy(), batch.target.mask.numpy()
    expected = x[..., 1] - 0.2 * x[..., 2] + 0.05 * (start + x[..., 0])
    np.testing.assert_allclose(physical(dm, batch.target.y[..., 0], "u10", None)[m], expected[m], atol=1e-3)
    assert dm.task.cache.reads == len(np.unique((start + np.arange(3)) // CHUNK))


def test_a_truncated_chunk_is_reported_with_the_store_and_chunk(store: str, tmp_path: Path) -> None:
    broken = tmp_path / "broken.zarr"
    shutil.copytree(store, broken)
    chunk = next(p for p in (broken / "u10").rglob("*") if p.is_file() and p.name.startswith("1"))
    chunk.write_bytes(chunk.read_bytes()[:7])
    cache = ChunkCache(str(broken), capacity=4, variables=["u10"])
    cache.read([("u10", np.array([0]))])  # chunk 0 is intact
    with pytest.raises(DataError, match=r"broken\.zarr.*'u10' time chunks \[1\].*truncated or corrupt"):
        cache.read([("u10", np.array([CHUNK]))])


MULTISOURCE_RECIPES = [
    p
    for p in sorted((ROOT / "recipes").glob("*.yaml"))
    if yaml.safe_load(p.read_text())["data"]["class_path"].endswith("MultiSourceDataModule")
]


@pytest.mark.parametrize("recipe", MULTISOURCE_RECIPES, ids=lambda p: p.stem)
def test_multisource_recipes_match_their_data_and_run_a_batch(recipe: Path) -> None:
    config = yaml.safe_load(recipe.read_text())
    model, data = config["model"]["init_args"], config["data"]["init_args"]["task"]
    names = [Source(v).name for v in data["variables"]]
    assert model["dim_y"] == dict.fromkeys(names, 1) and model["dim_x"] == 3
    assert model.get("target_dim_y", 1) == len(data.get("target_variables") or names)
    assert model["grid"]["shape"][0] == data["window"]  # one grid row per hour of the window
    module = NeuralProcessModule(**model)
    # A batch shaped like the recipe's tasks: every source on the recipe's region and hours.
    generator = torch.Generator().manual_seed(0)
    lower, upper = torch.tensor(model["grid"]["lower"]), torch.tensor(model["grid"]["upper"])

    def points(n: int) -> torch.Tensor:
        x = lower + (upper - lower) * torch.rand(2, n, 3, generator=generator)
        return torch.cat([x[..., :1].round(), x[..., 1:]], -1)

    context = {
        name: Observations(points(40), torch.randn(2, 40, 1), torch.ones(2, 40, dtype=torch.bool)) for name in names
    }
    dy = model.get("target_dim_y", 1)
    target = Observations(points(30), torch.randn(2, 30, dy), torch.ones(2, 30, dtype=torch.bool))
    batch = Batch(context, target)
    loss = -log_likelihood(module(batch), batch.target.y, batch.target.valid()).mean()
    loss.backward()
    assert torch.isfinite(loss)


def test_sample_recipe_reads_the_embedded_sample(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRIDTNP_CACHE", str(tmp_path))
    config = yaml.safe_load((ROOT / "recipes" / "era5_multisource_swin.yaml").read_text())
    data = config["data"]["init_args"]
    dm = MultiSourceDataModule(**{**data, "loader": {**data["loader"], "batch_size": 2}})
    dm.setup()
    batch = dm.split_task("test").sample(2, torch.Generator().manual_seed(0))
    assert batch.context["t2m"].x.shape[-1] == 3 and batch.target.y.shape == (2, round(0.25 * 4 * 33 * 49), 1)
    assert batch.target.mask.all()  # the sample has no missing values
    grid = config["model"]["init_args"]["grid"]
    x = batch.target.x.reshape(-1, 3)
    assert (x.min(0).values >= torch.tensor(grid["lower"])).all() and (
        x.max(0).values <= torch.tensor(grid["upper"])
    ).all()


def test_an_arco_style_store_is_refused_or_converted_lazily_with_given_stats(tmp_path: Path) -> None:
    # The public ARCO ERA5 layout: latitudes descending, longitudes in [0, 360), no gridtnp statistics.
    lat, lon = np.arange(60.0, 49.9, -2.5), np.arange(0.0, 360.0, 45.0)
    time = pd.date_range("2020-01-01", periods=72, freq="h")
    h, la, lo = np.meshgrid(np.arange(72), lat, lon, indexing="ij")
    values = (la + 0.01 * lo + 0.1 * h).astype(np.float32)
    xr.Dataset(
        {"2m_temperature": (("time", "latitude", "longitude"), values)},
        coords={"time": time, "latitude": lat, "longitude": lon},
    ).chunk({"time": 1}).to_zarr(tmp_path / "arco.zarr", zarr_format=2)
    store = str(tmp_path / "arco.zarr")
    kwargs = {"variables": ["2m_temperature"], "target_variables": None}
    with pytest.raises(DataError, match=r"latitudes are descending.*convert_layout"):
        datamodule(store, **kwargs)
    with pytest.raises(DataError, match=r"no normalisation statistics for '2m_temperature'.*stats"):
        datamodule(store, convert_layout=True, **kwargs)
    dm = datamodule(store, convert_layout=True, stats={"2m_temperature": [55.0, 5.0]}, **kwargs)
    batch = dm.split_task("train").sample(2, torch.Generator().manual_seed(0))
    x, m = batch.target.x.numpy(), batch.target.mask.numpy()
    assert x[..., 2].min() >= -180 and x[..., 2].max() < 180  # longitudes converted
    hour = batch.extras["start_hour"].numpy()[:, None] + x[..., 0]
    expected = x[..., 1] + 0.01 * (x[..., 2] % 360.0) + 0.1 * hour
    np.testing.assert_allclose(batch.target.y[..., 0].numpy()[m] * 5.0 + 55.0, expected[m], atol=1e-3)
    assert dm.task.cache.reads == len(np.unique(batch.extras["start_hour"].numpy()[:, None] + np.arange(3)))


def test_an_archive_with_a_century_long_axis_is_read_by_short_name_without_dask(tmp_path: Path) -> None:
    """ARCO-ERA5's axis runs decades past its data and holds dozens of variables: the converted store opens as
    lazy arrays of the variables asked (a dask graph of the axis took minutes and gigabytes a process)."""
    from tests.data.test_prepare_archive import century_archive

    lat, lon = np.arange(60.0, 49.9, -2.5), np.arange(0.0, 360.0, 45.0)
    path = tmp_path / "arco.zarr"
    group = century_archive(path, "2020-01-01", lat, lon, {"2m_temperature": False, "skin_temperature": False})
    h, la, lo = np.meshgrid(np.arange(72), lat, lon, indexing="ij")
    for name in ("2m_temperature", "skin_temperature"):
        group[name][:72] = (la + 0.01 * lo + 0.1 * h).astype(np.float32)
    kwargs = {"variables": ["t2m"], "target_variables": None, "stats": {"t2m": [55.0, 5.0]}}
    dm = datamodule(str(path), convert_layout=True, **kwargs)
    opened = dm.task.cache.dataset()
    assert list(opened.data_vars) == ["t2m"] and opened.t2m.chunks is None  # lazy backend arrays, no dask
    batch = dm.split_task("train").sample(2, torch.Generator().manual_seed(0))
    x, m = batch.target.x.numpy(), batch.target.mask.numpy()
    hour = batch.extras["start_hour"].numpy()[:, None] + x[..., 0]
    expected = x[..., 1] + 0.01 * (x[..., 2] % 360.0) + 0.1 * hour
    np.testing.assert_allclose(batch.target.y[..., 0].numpy()[m] * 5.0 + 55.0, expected[m], atol=1e-3)


def test_predictions_cover_the_test_split_with_dense_maps(store: str) -> None:
    dm = datamodule(store, batch_size=3)
    loader = dm.predict_dataloader()
    assert len(loader.dataset.starts) == 8 and len(loader.dataset) == 3  # 24 test hours: 8 windows of 3, batches of 3
    batch = next(iter(loader))
    assert batch.target.x.shape == (3, 3 * len(LAT) * len(LON), 3) and batch.target.mask.all()
    outputs = []
    for batch in loader:  # a stand-in model: predicts the truth, std 1 (normalised units)
        outputs.append({"mean": batch.target.y, "std": torch.ones_like(batch.target.y), **batch.extras})
    ds = dm.predictions_to_xarray(outputs)
    assert ds["u850_mean"].dims == ("time", "latitude", "longitude") and ds.sizes["time"] == 24
    assert str(ds.time.values[0])[:13] == "2020-01-03T00" and str(ds.time.values[-1])[:13] == "2020-01-03T23"
    hour = ((ds.time - ds.time[0]) / np.timedelta64(1, "h")).values + 48
    h, la, lo = np.meshgrid(hour, LAT, LON, indexing="ij")
    np.testing.assert_allclose(ds["u850_mean"].values, u_field(850.0, h, la, lo), atol=1e-3)
    np.testing.assert_allclose(ds["v850_mean"].values, -u_field(850.0, h, la, lo), atol=1e-3)
    _, std = normalisation_stats(open_store(store), "u", 850.0)
    np.testing.assert_allclose(ds["u850_std"].values, std, rtol=1e-5)
    # Batch by batch, as gridtnp predict appends them to a Zarr store: the same dataset once joined along time.
    xr.testing.assert_identical(xr.concat([dm.predictions_to_xarray([o]) for o in outputs], dim="time"), ds)


def test_variable_metadata_names_each_source_its_level_statistics_and_units(store: str) -> None:
    """What a checkpoint keeps: per-level statistics, units, the sources and the targets in y's column order."""
    dm = from_flat_arguments(MultiSourceDataModule, store=store, variables=["u@850", "v@850", "u@500", "u10"],
                               target_variables=["v@850", "u@850"], window=3, **DATES)  # fmt: skip
    assert dm.variable_metadata() is None  # before setup
    dm.setup()
    meta = dm.variable_metadata()
    assert meta["sources"] == {"u850": ["u850"], "v850": ["v850"], "u500": ["u500"], "u10": ["u10"]}
    assert meta["target"] == ["u850", "v850"]  # the targets' y columns follow the sources' order
    ds = open_store(dm.store_path())
    for name, variable, level in [("u850", "u", 850.0), ("u500", "u", 500.0), ("u10", "u10", None)]:
        mean, std = normalisation_stats(ds, variable, level)
        entry = meta["variables"][name]
        assert (entry["mean"], entry["std"]) == (mean, std)
        assert entry["units"] == str(ds[variable].attrs.get("units", ""))
    assert meta["variables"]["u850"]["mean"] != meta["variables"]["u500"]["mean"]
