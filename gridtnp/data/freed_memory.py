"""Processes that keep freed memory in their own heap, for the next batch or block.

DataLoader workers allocate and free the same large arrays for every batch (the chunks they read and decompress,
the fields of a batch, block sums, the batch they hand over); ``gridtnp data prepare`` does the same for every
block of the store it writes (128 MiB read, concatenated, written, freed). glibc's malloc gives arrays above a
threshold their own ``mmap`` and returns them to the kernel when freed, and trims the heap's free top, so each
batch's arrays come back as fresh pages that the kernel faults in and zeroes: on the global station task about a
quarter of a worker's CPU time went to that. ``keep_freed_memory()`` asks malloc to serve every allocation from the
heap and keep what is freed there (``mallopt``: ``M_MMAP_MAX = 0``, ``M_TRIM_THRESHOLD`` at 1 GiB), so a process's
memory stays at its largest working set and is reused. ``worker_init`` applies it in each DataLoader worker of a
DataModule that asks for it (``TaskDataModule.keep_freed_memory``; the training process itself is left as it is);
the ``gridtnp data prepare`` command applies it to its own process (``prepare()`` called from Python leaves the
caller's malloc as it is). ``GRIDTNP_KEEP_FREED_MEMORY=0`` turns it off. Elsewhere than glibc (macOS, musl) it
does nothing.

Work that computes more on its arrays than it allocates can lose (heap memory probably forgoes the huge pages
numpy asks for on large mappings): the multi-source task's workers were 3-13 % slower with it, and do without.
"""

from __future__ import annotations

import ctypes
import os

from gridtnp.libc import c_function

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_MAX = -4
TRIM_THRESHOLD = 2**30  # freed memory kept in the heap before any is returned to the kernel


def keep_freed_memory() -> bool:
    """Serve allocations from the heap and keep freed memory there (glibc); whether malloc took both settings."""
    if os.environ.get("GRIDTNP_KEEP_FREED_MEMORY", "1") == "0":
        return False
    mallopt = c_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 when it takes a setting (musl's stub returns 0: nothing changes there).
    return mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1


def worker_init(worker_id: int) -> None:
    """A DataLoader ``worker_init_fn``: ``keep_freed_memory()`` in the worker."""
    keep_freed_memory()
