"""Bounded-memory evaluation of pairwise work: run a function over chunks of query rows.

Pairwise MLPs (translation-equivariant attention, the RCNP's relational encoder) build a ``[B, Nq, Nk, hidden]``
tensor. ``map_query_chunks`` evaluates them over query chunks of at most ``max_pairs // (B Nk)`` rows, each chunk
under non-reentrant ``torch.utils.checkpoint`` when gradients are on, so forward and backward hold one chunk's pair
tensors at a time. On the CPU, freed heap pages are handed back to the OS every ``RELEASE_EVERY`` chunks
(``release_cpu_memory``), so that the process's resident memory stays bounded too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch.utils.checkpoint import checkpoint

from gridtnp.libc import c_function

T = TypeVar("T")

#: Default bound on the (batch item, query, key) triples held at once: ~0.5 KB each with the default rho (~30 MB).
DEFAULT_MAX_PAIRS = 2**16

#: On the CPU, freed heap pages are handed back to the OS after every this many chunks (see ``release_cpu_memory``).
RELEASE_EVERY = 16


def release_cpu_memory() -> None:
    """Return freed heap pages to the OS (glibc ``malloc_trim(0)``; a no-op elsewhere).

    glibc raises its mmap threshold once a large block has been freed, so the next chunks' tensors of a few MB come
    from the heap, and small long-lived allocations made between chunks (outputs, autograd nodes) fragment it: freed
    chunk buffers then stay resident and the process's memory grows with the number of chunks although the live
    tensors do not. Trimming every ``RELEASE_EVERY`` chunks keeps the resident size bounded.
    """
    trim = c_function("malloc_trim")
    if trim is not None:
        trim(0)


def check_max_pairs(max_pairs: int | None, where: str) -> None:
    """A clear error unless ``max_pairs`` is a positive bound or None (unchunked)."""
    if max_pairs is not None and max_pairs < 1:
        raise ValueError(f"{where}: max_pairs must be >= 1 or None (unchunked); got {max_pairs}.")


def map_query_chunks(
    fn: Callable[[int, int], T], num_queries: int, num_keys: int, max_pairs: int | None, cpu: bool = False
) -> list[T]:
    """``[fn(start, end), ...]`` over query ranges of at most ``max(1, max_pairs // num_keys)`` rows.

    ``num_keys`` is what one query row costs in pairs (``B * Nk`` for a batch).

    With more than one chunk and gradients enabled, each call runs under ``torch.utils.checkpoint`` (non-reentrant),
    so its intermediate tensors are recomputed in the backward pass instead of being stored. ``max_pairs=None``:
    one call, no checkpoint. With ``cpu``, ``release_cpu_memory`` runs every ``RELEASE_EVERY`` chunks, in the
    forward pass and in the backward pass's recomputation alike.
    """
    check_max_pairs(max_pairs, "map_query_chunks")
    step = num_queries if max_pairs is None else max(1, max_pairs // max(num_keys, 1))
    step = max(step, 1)
    if step >= num_queries:
        return [fn(0, num_queries)]

    def run(start: int, end: int) -> T:
        if cpu and (start // step) % RELEASE_EVERY == RELEASE_EVERY - 1:
            release_cpu_memory()
        return fn(start, end)

    use_checkpoint = torch.is_grad_enabled()
    out = []
    for start in range(0, num_queries, step):  # a loop over chunks of queries, not over points
        end = min(start + step, num_queries)
        if use_checkpoint:
            out.append(checkpoint(run, start, end, use_reentrant=False, preserve_rng_state=False))
        else:
            out.append(run(start, end))
    return out


__all__ = ["DEFAULT_MAX_PAIRS", "RELEASE_EVERY", "check_max_pairs", "map_query_chunks", "release_cpu_memory"]
