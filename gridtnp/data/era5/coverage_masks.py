"""Which blocks of each task's coarse layout the ``"grid"`` context keeps, when the grid leaves part of the box
uncovered: a trimmed side, scattered missing blocks, a masked region. Missing blocks are masked out (mask False),
never given a value.

* ``block_positions(layout)``: each padded block slot's block row and column, ``[B, size]`` each.
* ``trim_mask(layout, trim [B, 4], lat_ascending, lon_ascending)``: ``[B, size]`` False for the block rows / columns
  ``trim`` leaves out at ``(north, south, west, east)``.
* ``dropout_mask(layout, dropout, generator, lat_ascending, lon_ascending)``: ``[B, size]``: a random trim, missing
  blocks and a missing region per task, drawn as ``CoverageDropout`` says (training tasks).
"""

from __future__ import annotations

import numpy as np
import torch

from gridtnp.data.era5.blocks import BlockLayout
from gridtnp.data.era5.station_options import CoverageDropout


def block_positions(layout: BlockLayout) -> tuple[np.ndarray, np.ndarray]:
    """Block row and column ``[B, size]`` of every padded block slot (slots beyond ``num_blocks`` run past the
    last row)."""
    slot = np.arange(layout.size)[None, :]
    return slot // layout.block_cols[:, None], slot % layout.block_cols[:, None]


def trim_mask(layout: BlockLayout, trim: np.ndarray, lat_ascending: bool, lon_ascending: bool) -> np.ndarray:
    """``[B, size]``: False for the blocks in the ``trim [B, 4]`` (or ``[4]``) outermost block rows / columns at
    ``(north, south, west, east)``; block row 0 lies at the first latitude of the store (south when ascending)."""
    trim = np.broadcast_to(np.asarray(trim, dtype=np.int64), (len(layout.factor), 4))
    row, col = block_positions(layout)
    rows, cols = layout.block_rows[:, None], layout.block_cols[:, None]
    from_south = row if lat_ascending else rows - 1 - row
    from_west = col if lon_ascending else cols - 1 - col
    north, south, west, east = (trim[:, i : i + 1] for i in range(4))
    return (from_south >= south) & (from_south < rows - north) & (from_west >= west) & (from_west < cols - east)


def dropout_mask(
    layout: BlockLayout,
    dropout: CoverageDropout,
    generator: torch.Generator,
    lat_ascending: bool,
    lon_ascending: bool,
) -> np.ndarray:
    """``[B, size]``: the blocks each task keeps under ``dropout`` (one draw per task and side / block, from
    ``generator``); a task that would lose every block keeps them all, and a wrapped longitude axis (around the
    globe) is not trimmed."""
    b, size = len(layout.factor), layout.size

    def uniform(*shape: int) -> np.ndarray:
        return torch.rand(*shape, generator=generator, dtype=torch.float64).numpy()

    # trimmed sides: each side with probability trim_prob, by 1..max_trim block rows / columns; a longitude axis
    # around the globe has no west or east side
    depth = 1 + np.floor(uniform(b, 4) * dropout.max_trim).astype(np.int64)
    trim = np.where(uniform(b, 4) < dropout.trim_prob, depth, 0)
    trim[:, 2:] *= not layout.wrap_lon
    keep = trim_mask(layout, trim, lat_ascending, lon_ascending)
    # scattered missing blocks: in a share block_prob of the tasks, each block with probability block_fraction
    scattered = (uniform(b, 1) < dropout.block_prob) & (uniform(b, size) < dropout.block_fraction)
    # a masked region: 1..max_patch blocks high and wide, anywhere in the task's grid
    row, col = block_positions(layout)
    extent = 1 + np.floor(uniform(b, 2) * dropout.max_patch).astype(np.int64)  # [B, 2]
    height = np.minimum(extent[:, :1], layout.block_rows[:, None])  # [B, 1]
    width = np.minimum(extent[:, 1:], layout.block_cols[:, None])
    top = np.floor(uniform(b, 1) * (layout.block_rows[:, None] - height + 1)).astype(np.int64)
    left = np.floor(uniform(b, 1) * (layout.block_cols[:, None] - width + 1)).astype(np.int64)
    region = (row >= top) & (row < top + height) & (col >= left) & (col < left + width)
    region &= uniform(b, 1) < dropout.patch_prob
    keep &= ~scattered & ~region
    left_any = (keep & layout.exists).any(-1, keepdims=True)
    return keep | ~left_any
