"""Coarse grids that leave part of the box uncovered (``task.coverage_dropout`` for training tasks,
``task.eval_trim`` for evaluation): the right blocks are masked out of the ``"grid"`` context, nothing is filled in,
and nothing changes where the options are off."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gridtnp.batch import Batch
from gridtnp.data.era5.blocks import BlockLayout
from gridtnp.data.era5.coverage_masks import dropout_mask, trim_mask
from gridtnp.data.era5.station_options import CoverageDropout
from gridtnp.registry import ConfigError
from tests.data.test_era5 import LAT, LON, datamodule

# 9 x 9 fine points in 2 x 2 blocks from the first row / column: 5 x 5 blocks, the last row and column partial.
BLOCKS = {"coarsen": 2, "coarsen_offset": [0, 0], "batch_size": 8}
CENTRES_LAT = np.array([*(LAT[0:8].reshape(4, 2).mean(1)), LAT[8]])  # the 5 block rows' centres, south first
CENTRES_LON = np.array([*(LON[0:8].reshape(4, 2).mean(1)), LON[8]])


def train_batch(store: str, stations: str, **kwargs) -> Batch:
    return next(iter(datamodule(store, stations, **BLOCKS, **kwargs).train_dataloader()))


def block_index(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Block row and column of block centres ``x [N, 2]``, from the centres computed by hand above."""
    rows = np.abs(x[:, :1].numpy() - CENTRES_LAT[None]).argmin(1)
    cols = np.abs(x[:, 1:].numpy() - CENTRES_LON[None]).argmin(1)
    return rows, cols


def assert_only_the_grid_mask_differs(masked: Batch, full: Batch) -> None:
    """``masked`` is ``full`` with grid blocks masked out: the kept blocks' values are the full ones, masked ones
    zero, and the stations are untouched."""
    a, b = masked.context["grid"], full.context["grid"]
    assert b.mask.all() and (a.mask <= b.mask).all() and not a.mask.all()
    assert torch.equal(a.y[a.mask], b.y[a.mask]) and torch.equal(a.x[a.mask], b.x[a.mask])
    assert (a.y[~a.mask] == 0).all()
    for name in ("stations",):
        assert torch.equal(masked.context[name].y, full.context[name].y)
    assert torch.equal(masked.target.y, full.target.y) and torch.equal(masked.target.mask, full.target.mask)


def test_a_trimmed_side_masks_its_outermost_block_rows_and_columns(store: str, stations: str) -> None:
    full = train_batch(store, stations)
    trimmed = train_batch(store, stations, coverage_dropout={"trim_prob": 1.0, "max_trim": 1})
    assert_only_the_grid_mask_differs(trimmed, full)
    for b in range(8):  # every side trimmed by one block row / column: the 3 x 3 inner blocks stay
        grid = trimmed.context["grid"]
        rows, cols = block_index(grid.x[b][grid.mask[b]])
        assert sorted(zip(rows.tolist(), cols.tolist(), strict=True)) == [(r, c) for r in (1, 2, 3) for c in (1, 2, 3)]
    deeper = train_batch(store, stations, coverage_dropout={"trim_prob": 1.0, "max_trim": 2}).context["grid"]
    assert set(deeper.mask.sum(-1).tolist()) <= {1, 2, 3, 4, 6, 9} and (deeper.mask.sum(-1) < 9).any()


@pytest.mark.parametrize("ascending", [True, False])
def test_trim_sides_follow_the_direction_of_the_axes(ascending: bool) -> None:
    layout = BlockLayout(np.array([2]), np.array([[0, 0]]), (9, 9))  # 5 x 5 blocks, row 0 at the first latitude
    keep = trim_mask(layout, np.array([0, 1, 0, 2]), lat_ascending=ascending, lon_ascending=True)[0].reshape(5, 5)
    south = 0 if ascending else 4
    assert not keep[south].any() and not keep[:, 3:].any()  # the south row and two east columns
    assert keep[4 - south, :3].all() and keep.sum() == 4 * 3


def test_a_longitude_axis_around_the_globe_is_not_trimmed() -> None:
    layout = BlockLayout(np.array([2, 2]), np.array([[0, 0], [1, 1]]), (9, 36), wrap_lon=True)  # 18 block columns
    keep = dropout_mask(layout, CoverageDropout(trim_prob=1.0), torch.Generator().manual_seed(0), True, True)
    for b in range(2):
        rows = keep[b, : layout.num_blocks[b]].reshape(-1, 18)
        assert rows[1:-1].all() and not rows[[0, -1]].any()  # the first and last block rows only


def test_missing_blocks_are_masked_never_filled(store: str, stations: str) -> None:
    full = train_batch(store, stations)
    holes = train_batch(store, stations, coverage_dropout={"block_prob": 1.0, "block_fraction": 0.3})
    assert_only_the_grid_mask_differs(holes, full)
    missing = (~holes.context["grid"].mask).sum(-1).double()
    assert 1 <= missing.mean() <= 15  # about 0.3 of 25 blocks in every task, never all
    assert holes.context["grid"].mask.any(-1).all()


def test_a_masked_region_is_one_rectangle_of_blocks(store: str, stations: str) -> None:
    full = train_batch(store, stations)
    patch = train_batch(store, stations, coverage_dropout={"patch_prob": 1.0, "max_patch": 3})
    assert_only_the_grid_mask_differs(patch, full)
    grid = patch.context["grid"]
    for b in range(8):
        rows, cols = block_index(full.context["grid"].x[b][~grid.mask[b]])  # masked slots' x are zeroed
        height, width = rows.max() - rows.min() + 1, cols.max() - cols.min() + 1
        assert height <= 3 and width <= 3 and len(rows) == height * width  # contiguous, every block inside


def test_evaluation_tasks_keep_their_layout_and_eval_trim_trims_it(store: str, stations: str) -> None:
    on = {"trim_prob": 1.0, "block_prob": 1.0, "block_fraction": 0.5, "patch_prob": 1.0}
    plain, dropped = (datamodule(store, stations, **BLOCKS, coverage_dropout=c) for c in (None, on))
    for name in ("val_dataloader", "test_dataloader", "predict_dataloader"):
        a, b = (next(iter(getattr(dm, name)())) for dm in (plain, dropped))
        assert a.context["grid"].mask.all() and torch.equal(a.context["grid"].mask, b.context["grid"].mask)
        assert torch.equal(a.context["grid"].y, b.context["grid"].y)
    trimmed = datamodule(store, stations, **BLOCKS, eval_trim={"south": 1, "east": 1})
    full, cut = (next(iter(dm.test_dataloader())) for dm in (plain, trimmed))
    assert_only_the_grid_mask_differs(cut, full)
    grid = cut.context["grid"]
    for b in range(len(grid.mask)):  # the southern block row and the eastern block column, nothing else
        rows, cols = block_index(full.context["grid"].x[b][~grid.mask[b]])
        assert set(zip(rows.tolist(), cols.tolist(), strict=True)) == {(0, c) for c in range(5)} | {
            (r, 4) for r in range(5)
        }
    train_a, train_b = (next(iter(dm.train_dataloader())) for dm in (plain, trimmed))
    assert torch.equal(train_a.context["grid"].mask, train_b.context["grid"].mask)  # eval_trim: evaluation only


def test_switched_off_the_tasks_are_those_without_the_option(store: str, stations: str) -> None:
    full = train_batch(store, stations)
    zero = {"trim_prob": 0.0, "block_prob": 0.0, "patch_prob": 0.0}
    for off in (train_batch(store, stations, coverage_dropout=None), train_batch(store, stations, **{
        "coverage_dropout": zero
    })):  # fmt: skip
        assert torch.equal(off.context["grid"].mask, full.context["grid"].mask)
        assert torch.equal(off.context["grid"].y, full.context["grid"].y)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"coverage_dropout": {"trim_prob": 1.5}}, "task.coverage_dropout.trim_prob must be a probability"),
        ({"coverage_dropout": {"max_trim": 0}}, "task.coverage_dropout.max_trim must be an integer >= 1"),
        ({"coverage_dropout": {"trim": 0.3}}, "task.coverage_dropout has no key 'trim'"),
        ({"eval_trim": {"top": 1}}, "task.eval_trim has no side 'top'"),
        ({"eval_trim": [1, 1]}, "task.eval_trim must be a mapping of sides"),
    ],
)
def test_coverage_options_are_checked(store: str, stations: str, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        datamodule(store, stations, **kwargs)
