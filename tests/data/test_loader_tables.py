"""Per-layout tables of the station task's coarse context (``gridtnp.data.era5.blocks``): cached block centres,
block sums along each axis and the stations' block means equal what the per-task label bincounts give, and the
training split builds them in the main process."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from gridtnp.batch import Batch
from gridtnp.data import StationReanalysisDataModule
from gridtnp.data.era5.blocks import BlockLayout, LayoutTables, _axis_sums
from gridtnp.data.era5.station_tasks import SplitTask
from gridtnp.data.sections import from_flat_arguments


@pytest.mark.parametrize("wrap_lon", [False, True])
def test_cached_tables_equal_the_recomputed_values_for_every_layout(wrap_lon: bool) -> None:
    rng = np.random.default_rng(1)
    h, w = 13, 24  # 2, 3, 4 divide 24 (blocks wrap across the date line when wrap_lon), 5 does not
    lat = np.linspace(-60.0, 60.0, h)
    lon = np.arange(-180.0, 180.0, 15.0)
    points = rng.choice(h * w, 40, replace=False)
    tables = LayoutTables(lat, lon, wrap_lon, points)
    keys = [(f, a, o) for f in (1, 2, 3, 4, 5) for a, o in itertools.product(range(f), range(f))]
    for chunk in range(0, len(keys), 7):  # batches mixing layouts, some repeated (served from the cache)
        batch = keys[chunk : chunk + 7] + keys[chunk : chunk + 2]
        factor = np.array([k[0] for k in batch])
        offset = np.array([[k[1], k[2]] for k in batch])
        layout = BlockLayout(factor, offset, (h, w), wrap_lon)
        values = rng.normal(size=(len(batch), h, w, 2))
        values[0, :3, :5, 0] = np.nan  # NaN-aware means, an all-NaN block
        values[1, 4, 7, 1] = np.nan
        want = layout.means(values.reshape(len(batch), h * w, 2))
        np.testing.assert_allclose(layout.fast_means(values), want, rtol=1e-12, atol=1e-12, equal_nan=True)
        np.testing.assert_array_equal(tables.centres(layout), layout.coordinates(lat, lon))
        station = values[..., 1].reshape(len(batch), h * w)
        rows = np.arange(len(batch))[:, None]
        expected = want[..., 1][rows, layout.labels[:, points]]
        np.testing.assert_allclose(
            tables.point_means(layout, station), expected, rtol=1e-12, atol=1e-12, equal_nan=True
        )
        np.testing.assert_array_equal(layout.block_of(points), layout.labels[:, points])
    assert len(tables._centres) == len(keys) and len(tables._members) == len(keys)


@pytest.mark.parametrize("axis", [1, 2])
def test_axis_sums_equal_reduceat_bit_for_bit(axis: int) -> None:
    rng = np.random.default_rng(2)
    values = (280.0 + 10.0 * rng.normal(size=(3, 23, 40, 2))).astype(np.float32)  # rows: slabs of 80 cells
    n = values.shape[axis]
    cases = [np.arange(0, n, 4), np.r_[0, np.arange(3, n, 4)], np.r_[0, np.arange(1, n, 5)], np.array([0, 2, 9, 11])]
    for edges in cases:  # whole runs with and without partial ends; the last: segments of mixed widths
        want = np.add.reduceat(values, edges, axis=axis, dtype=np.float64)
        np.testing.assert_array_equal(_axis_sums(values, edges, int(np.diff(edges).max()), axis), want)


def test_grouped_order_puts_each_layout_in_one_slice_with_the_same_sums() -> None:
    rng = np.random.default_rng(3)
    factor, offset = np.array([2, 3, 2, 3, 2, 2]), np.array([[0, 1], [1, 1], [1, 0], [1, 1], [0, 1], [1, 0]])
    layout = BlockLayout(factor, offset, (11, 16), wrap_lon=True)
    order, grouped = layout.grouped()
    assert sorted(order.tolist()) == list(range(6))
    assert all(np.array_equal(t, np.arange(t[0], t[0] + len(t))) for t in grouped.groups().values())
    values = rng.normal(size=(6, 11, 16, 1))
    values[4, 2, 3, 0] = np.nan
    for got, want in zip(grouped.block_sums(values[order]), layout.block_sums(values), strict=True):
        np.testing.assert_array_equal(got, want[order])


def test_the_training_split_builds_its_tables_before_the_workers_start() -> None:
    def first_batch(prebuilt: bool) -> tuple[int, Batch]:
        dm = from_flat_arguments(
            StationReanalysisDataModule, batch_size=4, train_batches=2
        )  # the embedded sample, 4 x 4 blocks
        dm.setup("fit")
        assert dm.task is not None and not dm.task.tables._centres
        # split_task("train") is what train_dataloader() calls in the main process; the other builds them lazily.
        split = dm.split_task("train") if prebuilt else SplitTask(dm.task, dm.splits["train"])
        built = len(dm.task.tables._centres)
        return built, split.sample(4, torch.Generator().manual_seed(3))

    built, eager = first_batch(prebuilt=True)
    none, lazy = first_batch(prebuilt=False)
    assert built == 16 and none == 0  # every offset of the 4 x 4 blocks, before any batch is drawn
    for name in ("grid", "stations"):
        np.testing.assert_array_equal(eager.context[name].x.numpy(), lazy.context[name].x.numpy())
        np.testing.assert_array_equal(eager.context[name].y.numpy(), lazy.context[name].y.numpy())
    np.testing.assert_array_equal(eager.target.y.numpy(), lazy.target.y.numpy())
