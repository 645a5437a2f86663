"""Station + reanalysis tasks (``StationReanalysisDataModule``) on small prepared stores, and physical-unit metrics."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr
import yaml
from torch.distributions import Normal

from gridtnp import NeuralProcessModule
from gridtnp.batch import Batch, Observations
from gridtnp.data import StationReanalysisDataModule
from gridtnp.data.layout import DataError
from gridtnp.data.prepare import prepare
from gridtnp.data.sections import from_flat_arguments
from gridtnp.data.store import coarsen_fields, normalisation_stats, open_store
from gridtnp.nn.likelihoods import log_likelihood
from gridtnp.registry import ConfigError

ROOT = Path(__file__).resolve().parents[2]
LAT = np.arange(50.0, 52.01, 0.25)  # 9 points
LON = np.arange(-1.0, 1.01, 0.25)  # 9 points
HOURS = 96  # 2020-01-01 to 2020-01-04
CHUNK = 6
DATES = {
    "train_dates": ("2020-01-01", "2020-01-02"),
    "val_dates": ("2020-01-03", "2020-01-03"),
    "test_dates": ("2020-01-04", "2020-01-04"),
}
# 12 stations on grid points inside the box, one duplicate of the first grid point, two outside the box.
STATIONS = [(LAT[i], LON[j]) for i, j in [(0, 0), (1, 3), (2, 7), (3, 2), (4, 4), (5, 8), (6, 1), (7, 6), (8, 0)]]
STATIONS += [(LAT[8], LON[8]), (LAT[4], LON[0]), (LAT[0], LON[5]), (LAT[0], LON[0]), (60.0, 5.0), (40.0, -1.0)]
NUM_INSIDE = 12


def field(nan: bool = False) -> xr.Dataset:
    """``t2m = 200 + lat + 0.1 lon + 0.01 hour`` and ``skt = t2m + 5``; with ``nan``, NaN holes (see below)."""
    time = pd.date_range("2020-01-01", periods=HOURS, freq="h")
    t2m = 200.0 + LAT[None, :, None] + 0.1 * LON[None, None, :] + 0.01 * np.arange(HOURS)[:, None, None]
    t2m = np.broadcast_to(t2m, (HOURS, len(LAT), len(LON))).astype(np.float32).copy()
    if nan:
        t2m[:, 0, 0] = np.nan  # the first station's grid point, every hour
        t2m[:, 4:8, 4:8] = np.nan  # the whole coarse block (1, 1), every hour
    return xr.Dataset(
        {"t2m": (("time", "lat", "lon"), t2m), "skt": (("time", "lat", "lon"), t2m + 5.0)},
        coords={"time": time, "lat": LAT, "lon": LON},
    )


def make_store(tmp: Path, nan: bool = False) -> str:
    source = tmp / "source.nc"
    field(nan).to_netcdf(source)
    out = prepare(
        [source], tmp / "store.zarr", train_start="2020-01-01", train_end="2020-01-02", time_chunk=CHUNK, progress=False
    )
    return str(out)


def write_stations(path: Path, rows: list[tuple[float, float]] | None = None) -> str:
    pd.DataFrame(rows or STATIONS, columns=["latitude", "longitude"]).to_csv(path, index=False)
    return str(path)


def datamodule(store: str, stations: str, **kwargs) -> StationReanalysisDataModule:
    args = {"batch_size": 4, "train_batches": 3, **DATES, **kwargs}
    dm = from_flat_arguments(StationReanalysisDataModule, store=store, stations=stations, **args)
    dm.setup()
    return dm


def expected_t2m(lat: np.ndarray, lon: np.ndarray, hour: np.ndarray) -> np.ndarray:
    return 200.0 + lat + 0.1 * lon + 0.01 * hour


def unnormalise(dm: StationReanalysisDataModule, y: torch.Tensor, variable: str = "t2m") -> np.ndarray:
    mean, std = normalisation_stats(open_store(dm.store_path()), variable)
    return y.double().numpy() * std + mean


def no_nan(batch: Batch) -> bool:
    tensors = [t for o in [*batch.context.values(), batch.target] for t in (o.x, o.y)] + list(batch.extras.values())
    return all(torch.isfinite(t.float()).all() for t in tensors)


def test_values_match_the_store_and_targets_are_held_out(store: str, stations: str) -> None:
    dm = datamodule(
        store,
        stations,
        context_fraction=(0.2, 0.6),
        grid_variables=["t2m", "skt"],
        targets="held_out",
        coarsen_offset=(0, 0),
    )
    assert dm.task.num_stations == NUM_INSIDE  # duplicate and outside stations dropped
    batch = next(iter(dm.train_dataloader()))
    hour = batch.extras["hour"].numpy()
    assert no_nan(batch)
    for obs in (batch.context["stations"], batch.target):
        x, m = obs.x.numpy(), obs.mask.numpy()
        want = expected_t2m(x[..., 0], x[..., 1], hour[:, None])
        np.testing.assert_allclose(unnormalise(dm, obs.y[..., 0])[m], want[m], atol=1e-3)
    # Held out: per task the context and target stations are disjoint and together are every station.
    ctx, tgt = batch.context["stations"], batch.target
    for b in range(batch.batch_size):  # test-side loop over tasks
        c = {tuple(p) for p in ctx.x[b][ctx.mask[b]].tolist()}
        t = {tuple(p) for p in tgt.x[b][tgt.mask[b]].tolist()}
        assert not c & t and len(c | t) == NUM_INSIDE
    n_ctx = ctx.mask.sum(1).numpy()
    assert ((n_ctx >= np.floor(0.2 * NUM_INSIDE)) & (n_ctx <= np.floor(0.6 * NUM_INSIDE))).all()
    # Grid context: each variable's 4 x 4 block means at the block centres.
    grid = batch.context["grid"]
    assert grid.y.shape == (4, 9, 2) and grid.mask.all()
    full = field().t2m.values[hour]  # [B, H, W]
    np.testing.assert_allclose(unnormalise(dm, grid.y[..., 0]), coarsen_fields(full, 4).reshape(4, 9), atol=1e-3)
    np.testing.assert_allclose(
        unnormalise(dm, grid.y[..., 1], "skt"), coarsen_fields(full + 5, 4).reshape(4, 9), atol=1e-3
    )
    np.testing.assert_allclose(grid.x[0, 0].numpy(), [50.375, -0.625])
    np.testing.assert_allclose(grid.x[0, -1].numpy(), [52.0, 1.0])  # the edge block has one point


def test_targets_are_every_station_by_default_and_say_which_were_context(store: str, stations: str) -> None:
    batch = next(iter(datamodule(store, stations, context_fraction=(0.2, 0.6)).train_dataloader()))
    assert batch.target.mask.sum(1).tolist() == [NUM_INSIDE] * 4
    ctx, tgt, is_context = batch.context["stations"], batch.target, batch.extras["is_context"]
    assert is_context.shape == tgt.mask.shape and is_context.dtype == torch.bool
    for b in range(batch.batch_size):  # test-side loop: a target is flagged iff its location is a context station's
        c = {tuple(p) for p in ctx.x[b][ctx.mask[b]].tolist()}
        flagged = [tuple(p) in c for p in tgt.x[b].tolist()]
        assert is_context[b].tolist() == flagged and sum(flagged) == int(ctx.mask[b].sum()) > 0


def test_coarsening_equals_numpy_block_mean() -> None:
    rng = np.random.default_rng(0)
    fields = rng.normal(size=(2, 3, 10, 7)).astype(np.float32)
    fields[0, 0, :4, :4] = np.nan  # an all-NaN block
    fields[1, 2, 5, 6] = np.nan  # one NaN in a ragged edge block
    out = coarsen_fields(fields, 4)
    assert out.shape == (2, 3, 3, 2)
    for i in range(3):  # test-side reference: loops over blocks
        for j in range(2):
            block = fields[..., 4 * i : 4 * i + 4, 4 * j : 4 * j + 4]
            finite = np.isfinite(block).sum((-2, -1))
            ref = np.where(finite > 0, np.nansum(block, (-2, -1)) / np.maximum(finite, 1), np.nan)
            np.testing.assert_allclose(out[..., i, j], ref, rtol=1e-5, equal_nan=True)
    assert np.isnan(out[0, 0, 0, 0])
    np.testing.assert_array_equal(coarsen_fields(fields, 1), fields)


def test_nans_are_masked_out_of_context_and_targets(tmp_path: Path, stations: str) -> None:
    dm = datamodule(make_store(tmp_path, nan=True), stations, coarsen_offset=(0, 0))
    batch = next(iter(dm.train_dataloader()))
    assert no_nan(batch)
    first = torch.tensor([LAT[0], LON[0]], dtype=torch.float32)
    at_first = (batch.target.x == first).all(-1)
    assert at_first.sum(1).tolist() == [1] * 4 and not batch.target.mask[at_first].any()
    assert batch.target.mask.sum(1).tolist() == [NUM_INSIDE - 3] * 4  # (0, 0), and (4, 4), (7, 6) in the hole
    ctx = batch.context["stations"]
    assert not ctx.mask[(ctx.x == first).all(-1)].any()
    grid = batch.context["grid"]
    assert grid.mask.sum(1).tolist() == [8] * 4 and not grid.mask[:, 4].any()  # block (1, 1) is all NaN
    assert (batch.target.y[~batch.target.mask] == 0).all()
    module = NeuralProcessModule(
        preset="cnp", dim=16, dim_x=2, dim_y={"grid": 1, "stations": 1}, target_source="stations"
    )
    loss = -log_likelihood(module(batch), batch.target.y, batch.target.valid()).mean()
    assert torch.isfinite(loss)


def test_describe_counts_the_stations_grid_and_hours_it_uses(store: str, stations: str) -> None:
    """The line ``gridtnp fit`` prints: 12 stations inside the 9 x 9 box, one sharing a grid point, two outside."""
    dm = datamodule(store, stations, coarsen=[2, 3], eval_draws=2, eval_stride=5, grid_variables=["skt"])
    assert dm.describe() == (
        "12 stations of 15 in stations.csv (2 outside the store, 1 sharing a grid point dropped) on 9 x 9 grid "
        "points; grid skt in 2 x 2 or 3 x 3 blocks (random offsets); targets all; train 48 hours, val 10 tasks, "
        "test 10 tasks"
    )
    points = datamodule(store, stations, random_points=20, num_targets=5).describe()
    assert points.startswith("20 random grid points a task instead of 12 stations") and "all (5 a task)" in points


def test_date_splits_are_in_range_and_disjoint(store: str, stations: str) -> None:
    dm = datamodule(store, stations)
    time = open_store(store).indexes["time"]
    hours = {}
    for split, (start, end) in (
        ("train", DATES["train_dates"]),
        ("val", DATES["val_dates"]),
        ("test", DATES["test_dates"]),
    ):
        loader = dm.train_dataloader() if split == "train" else getattr(dm, f"{split}_dataloader")()
        hours[split] = set(torch.cat([b.extras["hour"] for b in loader]).tolist())
        stamps = time[sorted(hours[split])]
        assert stamps.min() >= pd.Timestamp(start) and stamps.max() < pd.Timestamp(end) + pd.Timedelta(days=1)
    assert not hours["train"] & hours["val"] and not hours["val"] & hours["test"] and not hours["train"] & hours["test"]
    with pytest.raises(DataError, match="overlap"):
        datamodule(store, stations, val_dates=("2020-01-02", "2020-01-03"))


def test_time_offset_reads_the_grid_earlier(store: str, stations: str) -> None:
    dm = datamodule(store, stations, time_offset_hours=3, coarsen_offset=(0, 0))
    split = dm.splits["train"]
    assert split.target_time.min() == 3 and (split.target_time - split.grid_time == 3).all()
    batch = next(iter(dm.train_dataloader()))
    hour = batch.extras["hour"].numpy()
    want = coarsen_fields(field().t2m.values[hour - 3], 4).reshape(4, 9)
    np.testing.assert_allclose(unnormalise(dm, batch.context["grid"].y[..., 0]), want, atol=1e-3)


def test_ranks_draw_different_train_tasks_and_share_fixed_eval_sets(store: str, stations: str) -> None:
    dms = [datamodule(store, stations) for _ in range(2)]
    for rank, dm in enumerate(dms):
        dm.trainer = SimpleNamespace(current_epoch=0, global_rank=rank, world_size=2)
    train = [next(iter(dm.train_dataloader())) for dm in dms]
    assert not torch.equal(train[0].extras["hour"], train[1].extras["hour"])
    whole = iter(datamodule(store, stations).val_dataloader())  # one rank: the whole validation set, in order
    for dm, expected in zip(dms, [next(whole), next(whole)], strict=True):  # rank r of 2 reads global batch r first
        first = next(iter(dm.val_dataloader()))
        assert torch.equal(first.target.y, expected.target.y) and torch.equal(first.target.x, expected.target.x)
    dms[0].trainer = SimpleNamespace(current_epoch=1, global_rank=0, world_size=2)
    assert not torch.equal(next(iter(dms[0].train_dataloader())).extras["hour"], train[0].extras["hour"])


def test_batches_are_deterministic_per_seed(store: str, stations: str) -> None:
    a, b, c = (next(iter(datamodule(store, stations, seed=s).train_dataloader())) for s in (0, 0, 1))
    for key in ("grid", "stations"):
        assert torch.equal(a.context[key].y, b.context[key].y) and torch.equal(a.context[key].mask, b.context[key].mask)
    assert torch.equal(a.target.x, b.target.x) and not torch.equal(a.extras["hour"], c.extras["hour"])


def test_only_the_needed_time_chunks_are_read(store: str, stations: str) -> None:
    dm = datamodule(store, stations, cache_chunks=64)
    cache = dm.task.cache
    batch = next(iter(dm.train_dataloader()))
    needed = {("t2m", h // CHUNK) for h in batch.extras["hour"].tolist()}
    assert set(cache.loaded) == needed and cache.reads == len(needed)  # each needed chunk read once, nothing else
    assert dm.task.cache.bounds("t2m")[1] == CHUNK
    dm.task.sample(4, torch.Generator().manual_seed(0), dm.splits["train"])  # same split: chunks may repeat
    again = dm.task.cache.read([("t2m", batch.extras["hour"].numpy())])[0]
    assert cache.reads == len(set(cache.loaded)) and cache.hits > 0
    np.testing.assert_allclose(again, field().t2m.values[batch.extras["hour"].numpy()])


def test_dataloader_workers_open_their_own_store_and_give_the_same_batches(store: str, stations: str) -> None:
    dm = datamodule(store, stations, train_batches=4)
    serial = [b.extras["hour"] for b in dm.train_dataloader()]  # the main process has read (and cached) first
    dm.num_workers = 2
    parallel = [b.extras["hour"] for b in dm.train_dataloader()]
    assert sorted(map(tuple, torch.stack(serial).tolist())) == sorted(map(tuple, torch.stack(parallel).tolist()))


def test_cache_is_bounded_and_reopened_per_process(store: str, stations: str) -> None:
    import pickle

    dm = datamodule(store, stations, cache_chunks=2)
    cache = dm.task.cache
    for i in range(3):
        dm.task.sample(4, torch.Generator().manual_seed(i), dm.splits["train"])
        assert len(cache._lru) <= max(2, 4)
    clone = pickle.loads(pickle.dumps(cache))  # what a DataLoader worker receives
    assert clone._ds is None and not clone._lru and clone.reads == 0


def test_global_store_wraps_longitude_and_keeps_every_station(tmp_path: Path) -> None:
    from gridtnp.data.sample import STATIONS_SAMPLE, sample_path

    lat, lon = np.arange(-90.0, 90.1, 10.0), np.arange(-180.0, 180.0, 10.0)
    time = pd.date_range("2020-01-01", periods=48, freq="h")
    values = np.broadcast_to(250.0 + lat[:, None] + 0 * lon, (48, len(lat), len(lon))).astype(np.float32)
    xr.Dataset(
        {"t2m": (("time", "latitude", "longitude"), values)}, {"time": time, "latitude": lat, "longitude": lon}
    ).to_netcdf(tmp_path / "g.nc")
    store = str(prepare([tmp_path / "g.nc"], tmp_path / "g.zarr", train_end="2020-01-01", progress=False))
    day1, day2 = ("2020-01-01", "2020-01-01"), ("2020-01-02", "2020-01-02")
    with pytest.raises(DataError, match="overlap"):
        from_flat_arguments(
            StationReanalysisDataModule, store=store, coarsen=2, train_dates=day1, val_dates=day2, test_dates=day2
        ).setup()
    halves = {"val_dates": ("2020-01-02T00", "2020-01-02T11"), "test_dates": ("2020-01-02T12", "2020-01-02T23")}
    dm = from_flat_arguments(
        StationReanalysisDataModule,
        store=store,
        coarsen=2,
        batch_size=2,
        unique_grid_points=False,
        train_dates=day1,
        **halves,
    )
    dm.setup()
    assert dm.task.num_stations == len(pd.read_csv(sample_path(STATIONS_SAMPLE)))  # all 9,957 inside the globe
    batch = next(iter(dm.train_dataloader()))
    assert no_nan(batch) and batch.context["grid"].y.shape == (2, 10 * 18, 1)
    np.testing.assert_allclose(
        unnormalise(dm, batch.target.y[..., 0])[batch.target.mask.numpy()],
        160.0 + 10.0 * np.rint((batch.target.x[..., 0].numpy() + 90.0) / 10.0)[batch.target.mask.numpy()],
        atol=1e-3,
    )


def test_bad_inputs_raise_errors_naming_what_to_fix(tmp_path: Path, store: str, stations: str) -> None:
    with pytest.raises(DataError, match="'nope'"):
        datamodule(store, stations, grid_variables=["t2m", "nope"])
    with pytest.raises(DataError, match="outside the store"):
        datamodule(store, stations, test_dates=("2020-01-04", "2020-01-09"))
    bad = tmp_path / "bad.csv"
    bad.write_text("latitude,longitude\n50.0,0.0\nfifty,1.0\n51.0,0.5\n")
    with pytest.raises(DataError, match=r"bad\.csv.*line 3"):
        datamodule(store, str(bad))
    far = write_stations(tmp_path / "far.csv", [(10.0, 10.0), (11.0, 11.0)])
    with pytest.raises(DataError, match=r"far\.csv: 0 distinct station"):
        datamodule(store, far)
    with pytest.raises(DataError, match="No Zarr store"):
        datamodule(str(tmp_path / "missing.zarr"), stations)
    with pytest.raises(ConfigError, match="context_fraction"):
        from_flat_arguments(StationReanalysisDataModule, store=store, context_fraction=(0.5, 0.2))
    with pytest.raises(DataError, match=r"training dates 2020-01-01T00 to 2020-01-01T11: climatology needs every hour"):
        datamodule(store, stations, climatology=True, train_dates=("2020-01-01T00", "2020-01-01T11"))


@pytest.mark.filterwarnings("ignore:You are trying to `self.log")
def test_physical_rmse_is_normalised_rmse_times_scale() -> None:
    b, n = 3, 5
    y = torch.randn(b, n, 1)
    mask = torch.ones(b, n, dtype=torch.bool)
    mask[0, 3:] = False
    mean = y + torch.randn(b, n, 1)
    scale = torch.tensor([2.0, 2.0, 2.0])
    ctx = {"stations": Observations(torch.randn(b, 2, 2), torch.randn(b, 2, 1))}
    coarse = torch.rand(b, n) * mask
    batch = Batch(ctx, Observations(torch.randn(b, n, 2), y, mask), {"target_scale": scale, "coarse_sq_err": coarse})
    module = NeuralProcessModule(preset="cnp", dim=8, dim_x=2, dim_y={"stations": 1})
    module.forward = lambda batch: Normal(mean, torch.ones_like(mean))
    module._evaluate(batch, "test")
    metrics = module.metrics["test"]
    rmse = ((mean - y)[mask].square().mean()).sqrt()
    torch.testing.assert_close(metrics["rmse"].compute(), rmse)
    torch.testing.assert_close(metrics["rmse_physical"].compute(), 2.0 * rmse)
    torch.testing.assert_close(metrics["baseline_rmse_physical"].compute(), 2.0 * (coarse.sum() / 13).sqrt())
    # Per-task scales: errors are scaled before pooling over points.
    module.metrics["test"]["rmse_physical"].reset()
    batch.extras["target_scale"] = torch.tensor([1.0, 2.0, 3.0])
    module._evaluate(batch, "test")
    want = ((mean - y).square()[..., 0] * batch.extras["target_scale"].view(-1, 1) ** 2)[mask].mean().sqrt()
    torch.testing.assert_close(metrics["rmse_physical"].compute(), want)


def test_coarse_baseline_matches_a_direct_computation(store: str, stations: str) -> None:
    dm = datamodule(store, stations)
    batch = next(iter(dm.val_dataloader()))
    t, hour = batch.target, batch.extras["hour"].numpy()
    coarse = coarsen_fields(field().t2m.values[hour], 4)  # [B, 3, 3]
    lat_i = np.rint((t.x[..., 0].numpy() - LAT[0]) / 0.25).astype(int) // 4
    lon_i = np.rint((t.x[..., 1].numpy() - LON[0]) / 0.25).astype(int) // 4
    pred = coarse[np.arange(4)[:, None], lat_i, lon_i]
    _, std = normalisation_stats(open_store(store), "t2m")
    err = ((pred - unnormalise(dm, t.y[..., 0])) / std) ** 2
    want = np.where(t.mask.numpy(), err, 0)
    # atol: the reference's float32 block means of ~250 K values against the sampler's float64 ones
    np.testing.assert_allclose(batch.extras["coarse_sq_err"].numpy(), want, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(batch.extras["target_scale"].numpy(), std, rtol=1e-6)


RECIPES = [
    pytest.param(p, marks=pytest.mark.slow) if p.stem == "era5_swin_global" else p  # 64 x 128 tokens: slow on CPU
    for p in sorted((ROOT / "recipes").glob("*.yaml"))
    if yaml.safe_load(p.read_text())["data"]["class_path"].endswith("StationReanalysisDataModule")
]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_era5_recipes_build_and_run_a_batch(recipe: Path, store: str, stations: str) -> None:
    config = yaml.safe_load(recipe.read_text())
    module = NeuralProcessModule(**config["model"]["init_args"])
    assert set(module.model.encoders) == {"grid", "stations"} and module.model.target_source == "stations"
    task = config["data"]["init_args"].get("task", {})
    forecast = {k: task[k] for k in ("context_hours", "lead_hours") if k in task}  # forecast recipes: x = (h, lat, lon)
    batch = next(iter(datamodule(store, stations, batch_size=2, **forecast).train_dataloader()))
    loss = -log_likelihood(module(batch), batch.target.y, batch.target.valid()).mean()
    loss.backward()
    assert torch.isfinite(loss)


@pytest.mark.filterwarnings("ignore:You are trying to `self.log")
def test_swin_recipe_trains_one_step_on_a_sample_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRIDTNP_CACHE", str(tmp_path))
    config = yaml.safe_load((ROOT / "recipes" / "era5_swin.yaml").read_text())
    data = config["data"].get("init_args", {})
    dm = StationReanalysisDataModule(**{**data, "loader": {**data.get("loader", {}), "batch_size": 2}})
    dm.prepare_data()
    assert (tmp_path / "era5_t2m_uk_2019-03.zarr").is_dir()  # the embedded sample, prepared once
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert no_nan(batch) and batch.context["grid"].y.shape == (2, 9 * 13, 1)
    module = NeuralProcessModule(**config["model"]["init_args"])
    optimiser = torch.optim.AdamW(module.parameters(), lr=module.lr)  # the schedule needs a trainer's run length
    before = [p.detach().clone() for p in module.parameters()]
    loss = module.training_step(batch, 0)
    loss.backward()
    optimiser.step()
    assert torch.isfinite(loss)
    assert any(not torch.equal(p0, p) for p0, p in zip(before, module.parameters(), strict=True))


def test_station_locations_are_the_grid_points_their_values_come_from(tmp_path: Path, store: str) -> None:
    """A CSV station up to half a cell off the grid gets the coordinates of the grid point whose value it carries."""
    offsets = [(0.1, -0.12), (-0.12, 0.05), (0.06, 0.11)]
    picks = [(1, 3), (4, 4), (6, 1)]
    rows = [(LAT[i] + a, LON[j] + b) for (i, j), (a, b) in zip(picks, offsets, strict=True)]
    dm = datamodule(store, write_stations(tmp_path / "off_grid.csv", rows))
    batch = next(iter(dm.train_dataloader()))
    t, hour = batch.target, batch.extras["hour"].numpy()
    want = {(LAT[i], LON[j]) for i, j in picks}
    assert {(round(a, 6), round(b, 6)) for a, b in t.x[0].double().tolist()} == want
    # Each target's value is the store's at its x (the grid point), for every task.
    x = t.x.double().numpy()
    values = unnormalise(dm, t.y[..., 0])
    np.testing.assert_allclose(values, expected_t2m(x[..., 0], x[..., 1], hour[:, None]), atol=1e-3)


def test_statistics_over_validation_or_test_hours_are_refused(tmp_path: Path, stations: str) -> None:
    """A store whose statistics cover the whole input (prepare's default) leaks the val/test hours: refused with a
    message naming both periods, unless allow_stats_overlap or the statistics are given."""
    source = tmp_path / "source.nc"
    field().to_netcdf(source)
    whole = str(prepare([source], tmp_path / "whole.zarr", time_chunk=CHUNK, progress=False))
    with pytest.raises(DataError, match=r"2020-01-01T00:00.*2020-01-04T23:00.*val dates 2020-01-03 to 2020-01-03"):
        datamodule(whole, stations)
    dm = datamodule(whole, stations, allow_stats_overlap=True)
    assert dm.task is not None
    assert datamodule(whole, stations, stats={"t2m": [250.0, 1.0]}).task is not None
    # Statistics over the training dates only (the store fixture) are accepted; a test split inside them is not.
    train_only = str(prepare([source], tmp_path / "t.zarr", None, "2020-01-01", "2020-01-03", CHUNK, progress=False))
    dates = {**DATES, "val_dates": ("2020-01-04", "2020-01-04"), "test_dates": ("2020-01-03", "2020-01-03")}
    with pytest.raises(DataError, match=r"test dates 2020-01-03 to 2020-01-03.*allow_stats_overlap"):
        datamodule(train_only, stations, **dates)


@pytest.mark.filterwarnings("ignore:You are trying to `self.log")
def test_baseline_rmse_is_cos_latitude_weighted_like_the_model_rmse() -> None:
    """With cos_latitude_weighting, the baseline's RMSE weights each target by cos(latitude), as the model's."""
    b, n = 2, 4
    lat = torch.tensor([[0.0, 60.0, 80.0, 30.0], [45.0, 10.0, 70.0, 0.0]])
    x = torch.stack([lat, torch.zeros(b, n)], -1)
    y, mask = torch.zeros(b, n, 1), torch.tensor([[True, True, True, False], [True, True, True, True]])
    coarse = torch.tensor([[1.0, 4.0, 9.0, 0.0], [0.25, 1.0, 16.0, 2.0]])
    ctx = {"stations": Observations(torch.randn(b, 2, 2), torch.randn(b, 2, 1))}
    batch = Batch(ctx, Observations(x, y, mask), {"target_scale": torch.tensor([2.0, 3.0]), "coarse_sq_err": coarse})
    module = NeuralProcessModule(
        preset="cnp", dim=8, dim_x=2, dim_y={"stations": 1}, cos_latitude_weighting=True, latitude_dim=0
    )
    module.forward = lambda batch: Normal(torch.zeros(b, n, 1), torch.ones(b, n, 1))
    module._evaluate(batch, "test")
    num, den = 0.0, 0.0
    for i in range(b):  # by hand
        for j in range(n):
            if mask[i, j]:
                wij = math.cos(math.radians(float(lat[i, j])))
                num += wij * float(coarse[i, j]) * [4.0, 9.0][i]
                den += wij
    got = module.metrics["test"]["baseline_rmse_physical"].compute()
    torch.testing.assert_close(got, torch.tensor(math.sqrt(num / den)))
