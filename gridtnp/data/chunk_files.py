"""``ChunkFiles``: the time chunks ``[steps, ..., H, W]`` of one variable of a local Zarr v2 store, read from their
files and decoded by the array's own numcodecs compressor; ``ChunkFiles.of`` gives ``None`` for an array it does
not read (chunked in space, filtered, Zarr v3), which ``ChunkCache`` then reads through xarray and zarr.

zarr-python 3 reads a chunk through its asynchronous pipeline (an event loop, a thread for the file, one for the
decode, a copy into a new array): on the Table 2 store's 4 MB chunks that cost about 5 ms of CPU a chunk against
1.6 ms to decode it and 0.7 ms to read its file, half the multi-source loader's reading time.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import uuid
from pathlib import Path

import numcodecs
import numpy as np

# Zarr v2's JSON spellings of the non-finite fill values.
_FILL_NAMES = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
# Attributes by which xarray decodes stored values (packed integers, masked fill values): such arrays go through it.
_CF_ENCODING = {"scale_factor", "add_offset", "_FillValue", "missing_value", "_Unsigned", "valid_range", "dtype"}


class ChunkFiles:
    """Whole time chunks of a Zarr v2 array chunked along time only: ``read(a, b)`` gives steps ``[a, b)`` of one
    chunk, cut to ``index`` (the region's slices of the other dimensions), as ``[b - a, ...]``.

    With ``local``, a folder on the node's own disk, each chunk file is copied there (compressed, as stored) on its
    first read and read from there afterwards, by every process that shares the folder: a store on a shared
    filesystem is then read once per node, not once per rank and epoch. The copies are keyed by the store's path
    and assume the store does not change (delete the folder after rewriting a store). ``copied`` and ``reused``
    count chunk files taken from the store into the folder and read back from it.
    """

    def __init__(self, folder: Path, meta: dict, index: tuple[slice, ...], local: Path | None = None) -> None:
        self.folder, self.index, self.local = folder, index, local
        self.copied = self.reused = 0
        self.shape, self.dtype = tuple(meta["chunks"]), np.dtype(meta["dtype"])
        self.codec = numcodecs.get_codec(meta["compressor"]) if meta.get("compressor") else None
        self.separator = meta.get("dimension_separator") or "."
        fill = meta.get("fill_value")
        self.fill = 0 if fill is None else _FILL_NAMES.get(fill, fill)
        self.cut = any(s != slice(None) for s in index)  # a region: copied out, so the whole chunk is not kept

    @classmethod
    def of(
        cls,
        store: str,
        variable: str,
        dims: tuple[str, ...],
        shape: tuple[int, ...],
        region: dict[str, slice],
        local_cache: str | None = None,
    ) -> ChunkFiles | None:
        """The reader of ``variable`` in the local ``store`` when its stored array has ``dims`` and ``shape`` (the
        variable as opened, before ``region``), is C-ordered floats with no filters, no CF encoding (xarray would
        unpack or mask its values) and a NaN or no fill value, and is chunked along its first dimension only;
        otherwise ``None``. ``local_cache``: the node-local folder of the copies (see the class)."""
        folder = Path(store) / variable
        try:
            meta = json.loads((folder / ".zarray").read_text())
            attrs = json.loads((folder / ".zattrs").read_text())
        except (OSError, ValueError):
            return None
        fill = meta.get("fill_value")
        readable = (
            meta.get("zarr_format") == 2
            and meta.get("order") == "C"
            and not meta.get("filters")
            and np.dtype(meta.get("dtype", "O")).isnative
            and np.dtype(meta.get("dtype", "O")).kind == "f"
            and (fill is None or fill == "NaN")
            and not _CF_ENCODING & set(attrs)
            and attrs.get("_ARRAY_DIMENSIONS") == list(dims)
            and tuple(meta.get("shape", ())) == tuple(shape)
            and tuple(meta.get("chunks", ()))[1:] == tuple(shape)[1:]
        )
        if not readable:
            return None
        local = None
        if local_cache is not None:
            key = hashlib.sha1(str(Path(store).resolve()).encode()).hexdigest()[:16]
            local = Path(os.path.expandvars(local_cache)).expanduser() / f"{Path(store).name}-{key}" / variable
        return cls(folder, meta, (slice(None), *(region.get(d, slice(None)) for d in dims[1:])), local)

    def _chunk_bytes(self, name: str) -> bytes:
        """The stored bytes of chunk file ``name``: from the node-local copy where there is one, else from the
        store (copied to the node-local folder first, where one is set); FileNotFoundError for an unwritten chunk."""
        if self.local is None:
            return (self.folder / name).read_bytes()
        copy = self.local / name
        try:
            raw = copy.read_bytes()
        except FileNotFoundError:
            raw = (self.folder / name).read_bytes()
            self.local.mkdir(parents=True, exist_ok=True)
            partial = copy.with_name(f".{name}.{uuid.uuid4().hex}")  # then renamed: readers never see half a file
            partial.write_bytes(raw)
            os.replace(partial, copy)
            self.copied += 1
        else:
            self.reused += 1
        return raw

    def read(self, a: int, b: int) -> np.ndarray:
        """Steps ``[a, b)`` of one stored chunk, ``[b - a, ...]`` (read-only where nothing was cut)."""
        c, first = divmod(a, self.shape[0])
        if b - a > self.shape[0] - first:
            raise ValueError(f"steps {a} to {b} span more than chunk {c} of {self.folder}")
        name = self.separator.join([str(c)] + ["0"] * (len(self.shape) - 1))
        path = self.folder / name
        try:
            raw = self._chunk_bytes(name)
        except FileNotFoundError:  # an unwritten chunk holds the fill value
            chunk = np.full(self.shape, self.fill, dtype=self.dtype)
        else:
            data = self.codec.decode(raw) if self.codec is not None else raw
            flat = np.frombuffer(data, dtype=self.dtype)
            if flat.size != math.prod(self.shape):
                raise ValueError(f"{path} decodes to {flat.size} values, not the {math.prod(self.shape)} of a chunk")
            chunk = flat.reshape(self.shape)
        out = chunk[(slice(first, first + b - a), *self.index[1:])]
        return np.ascontiguousarray(out) if self.cut else out
