"""Coarse context lattices that differ from task to task: block averages of a fine field, one layout per task.

A layout is a block size ``c`` and an offset ``o = (o_lat, o_lon)`` in fine cells, ``0 <= o < c``: block edges lie
at fine rows ``o, o + c, o + 2c, ...`` (rows before ``o`` form a partial first block), so the ``c * c`` layouts of
one size are the equally valid ways to coarsen a field by ``c``. ``o = 0`` is ``store.coarsen_fields``.

* ``BlockLayout(factor [B], offset [B, 2], shape, wrap_lon)``: each task's block label of every fine point,
  ``labels [B, H * W]``, and the padded block count ``size`` (``num_blocks [B]`` real blocks per task). With
  ``wrap_lon`` (a longitude axis spanning 360 degrees) the columns past the last whole block join the first one
  across the date line, when the block size divides the axis.
* ``BlockLayout.coordinates(lat [H], lon [W])``: each block's centre ``[B, size, 2]`` (the mean of its points'
  coordinates, across the date line for wrapped blocks).
* ``BlockLayout.means(values [B, H * W, V])``: NaN-aware block means ``[B, size, V]`` (NaN where a block has no
  finite value or does not exist), by one ``bincount`` per variable over all tasks at once.
* ``draw_layouts(batch, factors, offset, generator)``: per-task sizes from ``factors`` and offsets (random or fixed).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


class BlockLayout:
    """Per-task coarsening of an ``H x W`` field: ``factor [B]`` block sizes, ``offset [B, 2]`` first block edges."""

    def __init__(self, factor: np.ndarray, offset: np.ndarray, shape: tuple[int, int], wrap_lon: bool = False) -> None:
        h, w = shape
        factor = np.asarray(factor, dtype=np.int64)  # [B]
        offset = np.asarray(offset, dtype=np.int64)  # [B, 2]
        pad = (factor[:, None] - offset) % factor[:, None]  # fine rows / cols a partial first block lacks
        rows = (np.arange(h)[None, :] + pad[:, :1]) // factor[:, None]  # [B, H] block row of each fine row
        cols = (np.arange(w)[None, :] + pad[:, 1:]) // factor[:, None]  # [B, W]
        self.block_rows = rows[:, -1] + 1  # [B]
        self.block_cols = cols[:, -1] + 1
        wraps = wrap_lon & (w % factor == 0)  # [B] whole blocks tile the circle: the last partial joins the first
        whole = w // factor
        self.wrapped = wraps[:, None] & (cols >= whole[:, None])  # [B, W] fine columns moved to the first block
        cols = np.where(self.wrapped, cols - whole[:, None], cols)
        self.block_cols = np.where(wraps, whole, self.block_cols)
        self.num_blocks = self.block_rows * self.block_cols  # [B]
        self.size = int(self.num_blocks.max())
        self.labels = (rows[:, :, None] * self.block_cols[:, None, None] + cols[:, None, :]).reshape(len(factor), -1)
        self.factor, self.offset, self.shape = factor, offset, (h, w)

    @property
    def exists(self) -> np.ndarray:
        """``[B, size]``: which padded block slots are real blocks of their task."""
        return np.arange(self.size)[None, :] < self.num_blocks[:, None]

    def means(self, values: np.ndarray) -> np.ndarray:
        """NaN-aware block means ``[B, size, V]`` of ``values [B, H * W, V]`` (or ``[H * W, V]``, shared by tasks)."""
        b, n = self.labels.shape
        values = np.broadcast_to(values, (b, n, values.shape[-1]))
        flat = (self.labels + self.size * np.arange(b)[:, None]).ravel()  # one label per (task, fine point)
        out = np.empty((b * self.size, values.shape[-1]), dtype=np.float64)
        for v in range(values.shape[-1]):  # a handful of variables; each bincount covers every task and point
            column = values[..., v].ravel()
            finite = np.isfinite(column)
            total = np.bincount(flat, np.where(finite, column, 0.0), minlength=b * self.size)
            count = np.bincount(flat, finite, minlength=b * self.size)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[:, v] = np.where(count > 0, total / count, np.nan)
        return out.reshape(b, self.size, -1)  # float64: callers cast

    def coordinates(self, lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
        """Block centres ``[B, size, 2]`` (lat, lon): the mean of each block's points (0 for padding slots)."""
        b = len(self.factor)
        lat2 = np.broadcast_to(lat[None, :, None], (b, *self.shape)).astype(np.float64)
        lon2 = np.broadcast_to(lon[None, None, :] - 360.0 * self.wrapped[:, None, :], (b, *self.shape))
        x = self.means(np.stack([lat2, lon2], -1).reshape(b, -1, 2))
        x[..., 1] = np.where(x[..., 1] < -180.0, x[..., 1] + 360.0, x[..., 1])
        return np.nan_to_num(x)

    def block_of(self, flat_index: np.ndarray) -> np.ndarray:
        """``[B, S]``: each task's block (index into ``size``) of the fine points ``flat_index [S]`` (``i * W + j``)."""
        return self.labels[:, flat_index]


def draw_layouts(
    batch: int, factors: Sequence[int], offset: Sequence[int] | None, generator: torch.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``factor [B]`` drawn uniformly from ``factors`` and ``offset [B, 2]``: uniform in ``[0, factor)`` per
    dimension when ``offset`` is None, else ``offset`` for every task (it must be below every factor)."""
    choice = torch.randint(len(factors), (batch,), generator=generator).numpy()
    factor = np.asarray(factors, dtype=np.int64)[choice]
    if offset is None:
        u = torch.rand(batch, 2, generator=generator, dtype=torch.float64).numpy()
        return factor, np.minimum((u * factor[:, None]).astype(np.int64), factor[:, None] - 1)
    return factor, np.broadcast_to(np.asarray(offset, dtype=np.int64), (batch, 2)).copy()
