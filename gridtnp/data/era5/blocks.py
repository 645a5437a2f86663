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
* ``BlockLayout.fast_means(values [B, H, W, V])``: the same means by a sum along each axis per distinct layout of
  the batch (no per-point labels; the station task's path). ``BlockLayout.grouped()`` orders the tasks so that
  each layout's tasks are one slice of the batch: summed in place, not copied out.
* ``LayoutTables(lat, lon, wrap_lon, points)``: what depends on a layout alone, built once per ``(factor, offset)``:
  block centres (``centres(layout) -> [B, size, 2]``) and the means of the blocks holding ``points`` only
  (``point_means(layout, values [B, H * W]) -> [B, S]``, the coarse-cell baseline at the stations).
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
        self.rows, self.cols = rows, cols  # [B, H], [B, W] block row / column of each fine row / column
        self.factor, self.offset, self.shape, self.wrap_lon = factor, offset, (h, w), wrap_lon
        self._labels: np.ndarray | None = None

    @property
    def labels(self) -> np.ndarray:
        """``[B, H * W]``: each task's block (index into ``size``) of every fine point, built on first use."""
        if self._labels is None:
            b = len(self.factor)
            grid = self.rows[:, :, None] * self.block_cols[:, None, None] + self.cols[:, None, :]
            self._labels = grid.reshape(b, -1)
        return self._labels

    def key(self, task: int) -> tuple[int, int, int]:
        """``(factor, lat offset, lon offset)`` of task ``task``: tasks with equal keys share every block."""
        return int(self.factor[task]), int(self.offset[task, 0]), int(self.offset[task, 1])

    def groups(self) -> dict[tuple[int, int, int], np.ndarray]:
        """The tasks of each distinct layout: ``{key: task indices}``."""
        out: dict[tuple[int, int, int], list[int]] = {}
        for task in range(len(self.factor)):
            out.setdefault(self.key(task), []).append(task)
        return {k: np.asarray(v) for k, v in out.items()}

    def grouped(self) -> tuple[np.ndarray, BlockLayout]:
        """``order [B]`` that puts the tasks of each distinct layout next to each other, and the layout of the
        tasks in that order: its ``block_sums`` sum each layout's tasks as one slice of the batch, not a copy."""
        order = np.concatenate(list(self.groups().values()))
        return order, BlockLayout(self.factor[order], self.offset[order], self.shape, self.wrap_lon)

    def block_sums(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per-block sums of the finite values and their counts, ``[B, size, V]`` each (0 beyond ``num_blocks``),
        of ``values [B, H, W, V]``: one pass along each axis per distinct layout (no per-point labels)."""
        b, h, w, v = values.shape
        total = np.zeros((b, self.size, v), dtype=np.float64)
        count = np.zeros((b, self.size, v), dtype=np.float64)
        for tasks in self.groups().values():
            first, last = int(tasks[0]), int(tasks[-1])
            row_edges = np.flatnonzero(np.diff(self.rows[first], prepend=-1))  # first fine row of each block row
            col_edges = np.flatnonzero(np.diff(self.cols[first] + self.wrapped[first] * w, prepend=-1))
            edges = (row_edges, col_edges, int(self.factor[first]))
            # [k, H, W, V], summed in float64 below; a view where the layout's tasks are one run of the batch
            part = values[first : last + 1] if last - first + 1 == len(tasks) else values[tasks]
            sums = _block_grid_sums(part, *edges)
            if np.isfinite(sums).all():  # every value finite (one check on the sums): points per block, as laid out
                sizes = np.outer(np.diff(np.append(row_edges, h)), np.diff(np.append(col_edges, w)))
                counts = np.broadcast_to(sizes[None, :, :, None].astype(np.float64), sums.shape).copy()
            else:  # a NaN or inf somewhere: sums and counts of the finite values only
                finite = np.isfinite(part)
                sums, counts = _block_grid_sums(np.where(finite, part, 0.0), *edges), _block_grid_sums(finite, *edges)
            if self.wrapped[first].any():  # the partial last column block joins the first, across the date line
                sums[:, :, 0] += sums[:, :, -1]
                counts[:, :, 0] += counts[:, :, -1]
                sums, counts = sums[:, :, :-1], counts[:, :, :-1]
            n = sums.shape[1] * sums.shape[2]
            total[tasks, :n] = sums.reshape(len(tasks), n, v)
            count[tasks, :n] = counts.reshape(len(tasks), n, v)
        return total, count

    def fast_means(self, values: np.ndarray) -> np.ndarray:
        """``means`` of ``values [B, H, W, V]`` by ``block_sums``: the same values (up to summation order), NaN
        where a block has no finite value or does not exist."""
        total, count = self.block_sums(values)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(count > 0, total / count, np.nan)

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
        i, j = np.divmod(np.asarray(flat_index), self.shape[1])
        return self.rows[:, i] * self.block_cols[:, None] + self.cols[:, j]


class LayoutTables:
    """What depends on a layout alone, computed once per ``(factor, offset)`` and reused by every task drawing it:
    block centres (``centres``) and the fine points of the block holding each of ``points`` (``point_means``).

    ``lat [H]``, ``lon [W]``: the fine grid; ``points [S]``: flat indices (``i * W + j``) of points whose block
    means are wanted (e.g. stations, for the coarse-cell baseline). A layout's tables are built from a one-task
    ``BlockLayout`` (``coordinates``, ``labels``), so they are the values those give.
    """

    def __init__(self, lat: np.ndarray, lon: np.ndarray, wrap_lon: bool = False, points: np.ndarray | None = None):
        self.lat, self.lon = np.asarray(lat, dtype=np.float64), np.asarray(lon, dtype=np.float64)
        self.shape, self.wrap_lon = (len(self.lat), len(self.lon)), wrap_lon
        self.points = None if points is None else np.asarray(points, dtype=np.int64)
        self._centres: dict[tuple[int, int, int], np.ndarray] = {}
        self._members: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}

    def _single(self, key: tuple[int, int, int]) -> BlockLayout:
        factor, o_lat, o_lon = key
        return BlockLayout(np.array([factor]), np.array([[o_lat, o_lon]]), self.shape, self.wrap_lon)

    def layout_centres(self, key: tuple[int, int, int]) -> np.ndarray:
        """Block centres ``[num_blocks, 2]`` of layout ``key = (factor, lat offset, lon offset)``."""
        if key not in self._centres:
            single = self._single(key)
            self._centres[key] = single.coordinates(self.lat, self.lon)[0, : int(single.num_blocks[0])]
        return self._centres[key]

    def centres(self, layout: BlockLayout, dtype: np.dtype | type = np.float64) -> np.ndarray:
        """``layout.coordinates(lat, lon)`` from the tables: block centres ``[B, size, 2]`` as ``dtype``, 0 for padding
        slots."""
        out = np.zeros((len(layout.factor), layout.size, 2), dtype=dtype)
        for key, tasks in layout.groups().items():
            centres = self.layout_centres(key)
            out[tasks, : len(centres)] = centres
        return out

    def members(self, key: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
        """The fine points of the block holding each of ``points``: indices ``[S, M]`` and which are real ``[S, M]``
        (``M`` the largest block's point count)."""
        if self.points is None:
            raise ValueError("LayoutTables: point_means needs the points given at construction.")
        if key not in self._members:
            labels = self._single(key).labels[0]  # [H * W]
            order = np.argsort(labels, kind="stable")
            starts = np.searchsorted(labels[order], np.arange(int(labels.max()) + 2))
            block = labels[self.points]  # [S]
            first, size = starts[block], starts[block + 1] - starts[block]
            width = int(size.max())
            k = np.arange(width)
            valid = k[None, :] < size[:, None]
            index = order[np.where(valid, first[:, None] + k[None, :], 0)]
            self._members[key] = (index, valid)
        return self._members[key]

    def point_means(self, layout: BlockLayout, values: np.ndarray) -> np.ndarray:
        """NaN-aware mean ``[B, S]`` of ``values [B, H * W]`` over the block (of each task's layout) holding each
        of ``points``: one block mean per point, without the means of blocks holding none."""
        out = np.empty((len(layout.factor), len(self.points)), dtype=np.float64)  # type: ignore[arg-type]
        flat, size = values.reshape(-1), values.shape[1]  # one index into the flat fields: a faster gather than two
        for key, tasks in layout.groups().items():
            index, valid = self.members(key)
            picked = flat[(tasks * size)[:, None, None] + index[None]]  # [k, S, M], no copy of the fields
            ok = np.isfinite(picked)
            ok &= valid
            total = np.where(ok, picked, 0.0).sum(-1, dtype=np.float64)
            count = ok.sum(-1)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[tasks] = np.where(count > 0, total / count, np.nan)
        return out


def _block_grid_sums(values: np.ndarray, row_edges: np.ndarray, col_edges: np.ndarray, width: int) -> np.ndarray:
    """Float64 block sums ``[k, rows, cols, V]`` of ``values [k, H, W, V]``: along the rows, then the columns."""
    return _axis_sums(_axis_sums(values, row_edges, width, 1), col_edges, width, 2)


def _axis_sums(values: np.ndarray, edges: np.ndarray, width: int, axis: int) -> np.ndarray:
    """Float64 sums of ``values`` over the segments of ``axis`` that start at ``edges`` (the last runs to the end).

    The segments between a partial first and a partial last one are ``width`` cells each: those are summed as a
    reshape, one pass over the data (``np.add.reduceat`` runs its inner loop once per segment of a few cells).
    """
    bounds = np.append(edges, values.shape[axis])
    whole = np.flatnonzero(np.diff(bounds) == width)
    first, stop = (int(whole[0]), int(whole[-1]) + 1) if whole.size else (0, 0)
    if stop - first != whole.size or first > 1 or stop < len(edges) - 1:  # not one run of whole segments
        return np.add.reduceat(values, edges, axis=axis, dtype=np.float64)

    def cells(a: int, b: int) -> np.ndarray:
        return values[(slice(None),) * axis + (slice(a, b),)]

    middle = cells(int(bounds[first]), int(bounds[stop]))
    split = middle.reshape(*middle.shape[:axis], stop - first, width, *middle.shape[axis + 1 :])
    if np.prod(split.shape[axis + 2 :]) >= 64:  # slabs of cells after the axis: numpy adds them slab by slab
        pieces = [split.sum(axis + 1, dtype=np.float64)]
    else:  # a few cells after the axis, where numpy's reduction loops per output: one strided add per offset
        offset = (slice(None),) * (axis + 1)
        pieces = [split[(*offset, 0)].astype(np.float64)]
        for k in range(1, width):
            pieces[0] += split[(*offset, k)]
    if first:  # the partial first segment
        pieces.insert(0, cells(0, int(bounds[1])).sum(axis, keepdims=True, dtype=np.float64))
    if stop < len(edges):  # the partial last segment
        pieces.append(cells(int(bounds[stop]), int(bounds[-1])).sum(axis, keepdims=True, dtype=np.float64))
    return np.concatenate(pieces, axis) if len(pieces) > 1 else pieces[0]


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
