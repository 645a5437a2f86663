"""Coarse context lattices that change from task to task (``gridtnp.data.era5.blocks``) and the station task's
evaluation sets: every hour once, in order, under a fixed (and shiftable) layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr

from gridtnp.data.era5.blocks import BlockLayout, draw_layouts
from gridtnp.data.store import normalisation_stats, open_store
from gridtnp.inference import predict
from gridtnp.registry import ConfigError
from tests.data.test_era5 import (
    LAT,
    LON,
    datamodule,
    expected_t2m,
    field,
    make_store,
    unnormalise,
)


def loop_block_means(field2d: np.ndarray, factor: int, offset: tuple[int, int]) -> list[float]:
    """Test-side reference: block edges at ``offset + k * factor`` per dimension, NaN-aware means, row-major."""
    edges = [
        [0, *range(o if o else factor, n, factor), n] if o else [*range(0, n, factor), n]
        for o, n in zip(offset, field2d.shape, strict=True)
    ]
    out = []
    for r0, r1 in zip(edges[0][:-1], edges[0][1:], strict=True):
        for c0, c1 in zip(edges[1][:-1], edges[1][1:], strict=True):
            block = field2d[r0:r1, c0:c1]
            out.append(float(np.nanmean(block)) if np.isfinite(block).any() else np.nan)
    return out


def test_block_means_equal_a_loop_over_blocks_for_every_layout() -> None:
    rng = np.random.default_rng(0)
    h, w = 10, 7
    factor = np.array([4, 4, 3, 2, 5, 1])
    offset = np.array([[0, 0], [1, 3], [2, 0], [1, 1], [4, 2], [0, 0]])
    values = rng.normal(size=(6, h, w))
    values[1, :2, :3] = np.nan  # an all-NaN partial block
    values[2, 5, 6] = np.nan
    layout = BlockLayout(factor, offset, (h, w))
    out = layout.means(values.reshape(6, -1, 1))[..., 0]
    for b in range(6):
        want = loop_block_means(values[b], int(factor[b]), tuple(offset[b]))
        assert layout.num_blocks[b] == len(want)
        np.testing.assert_allclose(out[b, : len(want)], want, rtol=1e-12, equal_nan=True)
        assert np.isnan(out[b, len(want) :]).all() and layout.exists[b].sum() == len(want)
    lat, lon = np.arange(h) * 0.25, np.arange(w) * 0.25
    x = layout.coordinates(lat, lon)
    lat2, lon2 = np.meshgrid(lat, lon, indexing="ij")
    for b in range(6):
        n = layout.num_blocks[b]
        np.testing.assert_allclose(x[b, :n, 0], loop_block_means(lat2, int(factor[b]), tuple(offset[b])))
        np.testing.assert_allclose(x[b, :n, 1], loop_block_means(lon2, int(factor[b]), tuple(offset[b])))


def test_blocks_wrap_across_the_date_line_on_a_global_axis() -> None:
    lon = np.arange(-180.0, 180.0, 10.0)  # 36 points: a block size of 2 tiles the circle
    layout = BlockLayout(np.array([2, 2]), np.array([[0, 0], [0, 1]]), (1, 36), wrap_lon=True)
    assert layout.num_blocks.tolist() == [18, 18]
    values = np.broadcast_to(np.arange(36.0), (2, 36))[..., None]
    out, x = layout.means(values)[..., 0], layout.coordinates(np.zeros(1), lon)
    assert out[1, 0] == (0 + 35) / 2 and x[1, 0, 1] == 175.0  # points at 170 and -180: the block centre is 175
    np.testing.assert_allclose(x[0, :, 1], lon[::2] + 5.0)
    odd = BlockLayout(np.array([5]), np.array([[0, 1]]), (1, 36), wrap_lon=True)  # 5 does not divide 36: no wrap
    assert odd.num_blocks.tolist() == [8]


def test_training_layouts_differ_per_task_and_repeat_per_seed(store: str, stations: str) -> None:
    dm = datamodule(store, stations, coarsen=[2, 3, 4], batch_size=16)
    a, again = (next(iter(dm.train_dataloader())).context["grid"] for _ in range(2))
    lattices = {tuple(map(tuple, a.x[b][a.mask[b]].tolist())) for b in range(16)}
    assert len(lattices) > 4  # several different lattices in one batch
    assert torch.equal(a.x, again.x) and torch.equal(a.mask, again.mask)
    other = next(iter(datamodule(store, stations, coarsen=[2, 3, 4], batch_size=16, seed=1).train_dataloader()))
    assert not torch.equal(other.context["grid"].x, a.x)
    factor, offset = draw_layouts(2000, [2, 3, 4], None, torch.Generator().manual_seed(0))
    assert set(factor.tolist()) == {2, 3, 4} and ((offset >= 0) & (offset < factor[:, None])).all()
    assert all(len(set(map(tuple, offset[factor == f].tolist()))) == f * f for f in (2, 3, 4))  # every offset drawn


def test_each_training_task_holds_its_own_hour_under_its_own_layout(store: str, stations: str) -> None:
    # The block sums take each layout's tasks together (the fields are read in that order); every task's blocks
    # must still be its own hour's means on its own lattice.
    dm = datamodule(store, stations, coarsen=[2, 3, 4], batch_size=16)
    batch = next(iter(dm.train_dataloader()))
    grid, hour = batch.context["grid"], batch.extras["hour"].numpy()
    keys = [(f, a, o) for f in (2, 3, 4) for a in range(f) for o in range(f)]
    layouts = {k: BlockLayout(np.array([k[0]]), np.array([k[1:]]), (len(LAT), len(LON))) for k in keys}
    centres = {k: layout.coordinates(LAT, LON)[0, : int(layout.num_blocks[0])] for k, layout in layouts.items()}
    seen = set()
    for b in range(batch.batch_size):
        x = grid.x[b][grid.mask[b]].numpy()
        (key,) = [k for k, c in centres.items() if c.shape == x.shape and np.allclose(c, x, atol=1e-4)]
        want = loop_block_means(field().t2m.values[hour[b]], key[0], key[1:])
        np.testing.assert_allclose(unnormalise(dm, grid.y[b][grid.mask[b]][:, 0]), want, atol=1e-3)
        seen.add(key)
    assert len(seen) > 4 and len(set(hour.tolist())) > 4  # layouts and hours mixed across the batch


def test_evaluation_uses_one_layout_that_can_be_shifted(store: str, stations: str) -> None:
    for offset in [(0, 0), (1, 0), (3, 2)]:
        dm = datamodule(store, stations, eval_offset=offset)
        batch = next(iter(dm.test_dataloader()))
        grid, hour = batch.context["grid"], batch.extras["hour"].numpy()
        assert (grid.x == grid.x[:1]).all() and grid.mask.all()  # one lattice for every task
        for b in range(batch.batch_size):
            want = loop_block_means(field().t2m.values[hour[b]], 4, offset)
            np.testing.assert_allclose(unnormalise(dm, grid.y[b, :, 0]), want, atol=1e-3)
    shifted = datamodule(store, stations, eval_offset=(1, 0))
    x0 = next(iter(datamodule(store, stations).test_dataloader())).context["grid"].x[0]
    x1 = next(iter(shifted.test_dataloader())).context["grid"].x[0]
    assert x0.shape != x1.shape or not torch.equal(x0, x1)
    np.testing.assert_allclose(x1[0].numpy(), [LAT[0], np.mean(LON[:4])])  # row 0 alone, then blocks from row 1
    coarse2 = next(iter(datamodule(store, stations, coarsen=4, eval_coarsen=2).test_dataloader())).context["grid"]
    assert coarse2.y.shape[1] == 25  # 9 x 9 points in 2 x 2 blocks


def test_evaluation_sets_cover_every_hour_once_in_order(store: str, stations: str) -> None:
    for draws in (1, 3):
        dm = datamodule(store, stations, eval_draws=draws, batch_size=5)
        for split in ("val", "test"):
            batches = list(getattr(dm, f"{split}_dataloader")())
            hours = torch.cat([b.extras["hour"] for b in batches]).numpy()
            np.testing.assert_array_equal(hours, np.repeat(dm.splits[split].target_time, draws))
            again = torch.cat([b.context["stations"].mask.sum(1) for b in getattr(dm, f"{split}_dataloader")()])
            assert torch.equal(again, torch.cat([b.context["stations"].mask.sum(1) for b in batches]))
        if draws == 3:  # the draws of one hour are different contexts
            first = next(iter(dm.val_dataloader())).context["stations"]
            assert not torch.equal(first.x[0][first.mask[0]], first.x[1][first.mask[1]])
    strided = datamodule(store, stations, eval_stride=6)
    hours = torch.cat([b.extras["hour"] for b in strided.val_dataloader()]).numpy()
    np.testing.assert_array_equal(hours, strided.splits["val"].target_time[::6])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"coarsen_offset": (4, 0)}, r"coarsen_offset must be 'random' or \[lat, lon\] integers in 0\.\.3"),
        ({"coarsen": [2, 4], "coarsen_offset": (2, 0)}, r"integers in 0\.\.1"),
        ({"eval_offset": (0, -1)}, r"eval_offset must be \[lat, lon\] integers in 0\.\.3"),
        ({"coarsen": [0, 2]}, r"coarsen\[0\] must be an integer >= 1"),
        ({"coarsen": []}, r"coarsen must be an integer >= 1"),
        ({"targets": "some"}, "targets must be 'all' or 'held_out'"),
        ({"eval_draws": 0}, "eval_draws must be an integer >= 1"),
    ],
)
def test_layout_options_are_checked(store: str, stations: str, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        datamodule(store, stations, **kwargs)


def test_a_users_own_field_coarsens_at_any_offset_and_factor(tmp_path: Path, stations: str) -> None:
    dm = datamodule(make_store(tmp_path), stations, coarsen=3, eval_offset=(2, 1), batch_size=2)
    grid = next(iter(dm.val_dataloader())).context["grid"]
    assert grid.y.shape[1] == 4 * 4  # rows [0, 2), [2, 5), [5, 8), [8, 9); same for columns from 1
    assert float(grid.x[0, 0, 0]) == pytest.approx(np.mean(LAT[:2]))


def test_time_features_add_the_hour_of_day_to_every_block(store: str, stations: str) -> None:
    dm = datamodule(store, stations, time_features=True)
    assert dm.dim_y == {"grid": 3, "stations": 1}
    batch = next(iter(dm.train_dataloader()))
    grid, hour = batch.context["grid"], batch.extras["hour"].numpy()
    angle = 2 * np.pi * (hour % 24) / 24  # the test store starts at midnight, hourly
    want = np.stack([np.sin(angle), np.cos(angle)], -1)[:, None].repeat(grid.y.shape[1], 1)
    np.testing.assert_allclose(grid.y[..., 1:].numpy(), np.where(grid.mask[..., None].numpy(), want, 0), atol=1e-6)
    plain = next(iter(datamodule(store, stations).train_dataloader())).context["grid"]
    torch.testing.assert_close(grid.y[..., :1], plain.y)


def test_climatology_gives_departures_and_predictions_add_it_back(store: str, stations: str) -> None:
    # t2m = 200 + lat + 0.1 lon + 0.01 hour; the training dates are hours 0-47, so the climatology of hour of day h
    # is 200 + lat + 0.1 lon + 0.01 (h + 12), and a test hour (72 + h) departs from it by 0.6 K everywhere.
    dm = datamodule(store, stations, climatology=True)
    plain = datamodule(store, stations)
    batch, reference = next(iter(dm.test_dataloader())), next(iter(plain.test_dataloader()))
    std = normalisation_stats(open_store(dm.store_path()), "t2m")[1]
    target, grid = batch.target, batch.context["grid"]
    np.testing.assert_allclose(target.y[target.mask].double().numpy() * std, 0.6, atol=1e-4)
    np.testing.assert_allclose(grid.y[grid.mask].double().numpy() * std, 0.6, atol=1e-4)
    # The coarse-cell baseline stays the error of the values' blocks, not of the departures'.
    torch.testing.assert_close(batch.extras["coarse_sq_err"], reference.extras["coarse_sq_err"])
    kept = dm.variable_metadata()["climatology"]  # what a checkpoint keeps, for predict() without the store
    assert "climatology" not in plain.variable_metadata()
    np.testing.assert_allclose(kept["latitude"].numpy(), LAT)
    np.testing.assert_allclose(kept["longitude"].numpy(), LON)
    hour_of_day = np.arange(24)[:, None, None]
    want = 200.0 + LAT[None, :, None] + 0.1 * LON[None, None, :] + 0.01 * (hour_of_day + 12)
    np.testing.assert_allclose(kept["variables"]["t2m"].numpy(), want, atol=1e-4)
    # gridtnp predict: a perfect departure comes back as the store's value at each station and hour.
    loader = dm.predict_dataloader()
    outputs = []
    for b in loader:
        outputs.append(
            {"mean": b.target.y, "std": torch.ones_like(b.target.y), "y": b.target.y, "mask": b.target.mask, **b.extras}
        )
    ds = dm.predictions_to_xarray(outputs)
    hours = (ds.time.values - np.datetime64("2020-01-01T00")) / np.timedelta64(1, "h")
    want = expected_t2m(ds.latitude.values[None], ds.longitude.values[None], hours[:, None])
    np.testing.assert_allclose(ds["mean"].values, want, atol=1e-3)
    np.testing.assert_allclose(ds["observed"].values, want, atol=1e-3)


def test_a_checkpoint_without_its_climatology_refuses_raw_inputs() -> None:
    module = torch.nn.Module()
    module.model = torch.nn.Linear(1, 1)
    module.data_metadata = {"climatology": True, "variables": {}}  # a checkpoint that says so but lacks the field
    field = xr.DataArray(np.zeros((2, 2)), coords={"latitude": [50.0, 51.0], "longitude": [0.0, 1.0]})
    with pytest.raises(ConfigError, match="departures from an hourly climatology but does not keep it"):
        predict(module, {"grid": field}, field)
