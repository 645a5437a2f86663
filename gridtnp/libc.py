"""The C library's malloc controls (glibc's ``malloc_trim``, ``mallopt``), where the process has them."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any


@functools.cache
def c_function(name: str) -> Any | None:
    """The C library's function ``name`` (a ctypes function), or None where there is no such function (macOS for
    glibc's extensions, or no C library to load)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError, TypeError):
        return None
