"""Points of the multi-source task drawn by random keys (``first_by_key``) and the values of a batch's fields at
them (``field_index``): partial selections and flat gathers, with no full sort and no copy of a field per source."""

from __future__ import annotations

import numpy as np


def first_by_key(keys: np.ndarray, k: int) -> np.ndarray:
    """Indices ``[B, k]`` of the ``k`` smallest of ``keys [B, P]`` (float32 >= 0) in ascending order, ties by index:
    what ``argsort(keys, kind="stable")[:, :k]`` gives, by a partial selection (a tenth of a full sort's cost on
    the paper's 90,624 points a task)."""
    p = keys.shape[1]
    shift = max(p - 1, 1).bit_length()
    # A non-negative float32's bits order as its value; with the index in the bits below them every key is distinct.
    unique = np.left_shift(keys.view(np.int32), shift, dtype=np.int64)  # one pass: the widening in the shift
    unique |= np.arange(p)
    if k < p:
        unique.partition(k - 1, axis=1)  # in place: the array is this call's own
        unique = unique[:, :k]
    unique.sort(axis=1)
    unique &= (1 << shift) - 1
    return unique


def field_index(idx: np.ndarray, points: int, plane: int, levels: int) -> np.ndarray:
    """Flat indices ``[B, K]`` into a batch's field ``[B * T, levels, H, W]`` (at its first level) of the points
    ``idx [B, K]`` of each task's ``[T, H, W]`` window (``points = T * H * W``, ``plane = H * W``); the level
    ``l`` is the same indices into the field from ``l * plane`` on."""
    rows = np.arange(idx.shape[0], dtype=np.int64)[:, None] * (points * levels)
    if levels == 1:
        return idx + rows
    flat = idx // plane  # the hour in the window: its other levels lie before each point
    flat *= (levels - 1) * plane
    flat += idx
    flat += rows
    return flat
