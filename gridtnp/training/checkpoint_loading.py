"""Every checkpoint gridtnp reads is read here: tensors and plain values only (``weights_only``), never pickled code.

* ``load_checkpoint(path)``: the checkpoint's contents; ``UnsafeCheckpointError`` (one line naming the file and the
  Python global it refused) for a file that holds other Python objects, whose unpickling could run code.
* ``local_checkpoint(address, directory)``: a checkpoint address as a local file: a ``file://`` address as its path,
  a remote one (``http(s)://``, ``s3://``, ...) downloaded into ``directory`` first, so that it is checked and loaded
  as a local file is, and nothing else ever reads the address.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import torch

from gridtnp.files import is_url
from gridtnp.redaction import redact_url
from gridtnp.registry import ConfigError

# Types a gridtnp checkpoint may hold beyond torch's own allowlist (tensors, containers, numbers, strings):
# ``gridtnp fit`` writes none, so the list is empty; a type added here must not run code when unpickled.
ALLOWED_GLOBALS: list[Any] = []
_GLOBAL = re.compile(r"GLOBAL ([\w.]+)|global ['\"]?([\w.]+)")


class UnsafeCheckpointError(ConfigError):
    """A checkpoint that holds Python objects besides tensors and plain values: refused, never unpickled."""

    def __init__(self, path: str | os.PathLike, reason: str) -> None:
        super().__init__(f"checkpoint {path} is {reason}.")
        self.reason = reason


def load_checkpoint(path: str | os.PathLike, mmap: bool = False) -> Any:
    """``path``'s contents, loaded with ``weights_only=True`` and gridtnp's ``ALLOWED_GLOBALS`` onto the CPU.

    Raises ``UnsafeCheckpointError`` naming the file and the refused global; other read errors pass through.
    """
    try:
        with torch.serialization.safe_globals(ALLOWED_GLOBALS):
            return torch.load(path, map_location="cpu", mmap=mmap, weights_only=True)
    except pickle.UnpicklingError as err:
        text = str(err)
        found = _GLOBAL.search(text)
        name = (found.group(1) or found.group(2)) if found else (text.strip().splitlines() or ["?"])[0][:120]
        raise UnsafeCheckpointError(
            path,
            f"not loadable safely: it holds the Python object {name}, which is neither a tensor nor a plain value, "
            "and unpickling it could run code; gridtnp loads only checkpoints that `gridtnp fit` wrote",
        ) from None


def local_checkpoint(address: str | os.PathLike, directory: str | os.PathLike) -> Path:
    """``address`` as a local file: ``file://`` as its path, a remote address downloaded into ``directory``."""
    text = str(address)
    if not is_url(text):
        return Path(text)
    parts = urlsplit(text)
    if parts.scheme == "file":
        return Path(unquote(parts.path))
    import fsspec

    name = Path(unquote(parts.path)).name or "checkpoint.ckpt"
    target = Path(directory) / name
    shown = redact_url(text)
    try:
        with fsspec.open(text, "rb") as source, open(target, "wb") as out:
            shutil.copyfileobj(source, out, 2**20)
    except (OSError, ValueError, ImportError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(
            f"--ckpt_path {shown}: cannot download it ({redact_url(first)[:160]}); download the file and pass its "
            "local path."
        ) from None
    return target
