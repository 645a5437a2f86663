"""``ChunkCache``: whole time chunks ``[steps, ..., H, W]`` of a prepared store in a per-process LRU;
``read([(variable, time index [T])]) -> [fields [T, H, W]]`` (the store opened by ``gridtnp.data.store.open_store``).
"""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from gridtnp.data.chunk_files import ChunkFiles
from gridtnp.data.layout import DataError
from gridtnp.data.store import columns_as_read, open_store, time_chunk
from gridtnp.files import is_url

REMOTE_FETCH_THREADS = 16  # chunk reads in flight per process from a URL store


class ChunkCache:
    """Whole time chunks ``[steps, ..., H, W]`` of a lazily opened store, kept in an LRU per process.

    ``region`` (``{"latitude": slice, "longitude": slice}`` of indices) restricts every read to a box, so only the
    spatial chunks overlapping it are fetched from a store chunked in space too; the indices are those of the store
    as the DataModules open it (``open_store(..., continuous=True, west=west)``).

    The store is opened on first use in each process (a DataLoader worker opens its own handle) and the handle
    and cached arrays are dropped when pickled. A local Zarr v2 store read as stored (no converted layout, no
    columns moved for the date line) and chunked along time only has its chunk files read and decoded directly
    (``ChunkFiles``), the same values as zarr's with less CPU; other stores go through xarray and zarr. The chunks
    a read misses are fetched concurrently, ``fetch_threads`` at a time (default: 16 for a URL, 1 for a local
    store), each once. ``reads`` counts chunks read from the store, ``bytes_read`` their decoded bytes, ``hits``
    requests served from memory, ``loaded`` lists the ``(variable, chunk)`` pairs read, for tests and benchmarks.
    ``local_cache``: a node-local folder where the directly read chunk files are copied on first read and shared by
    the node's processes (``ChunkFiles``).
    """

    def __init__(
        self,
        store: str,
        capacity: int,
        storage_options: dict[str, Any] | None = None,
        variables: Sequence[str] = (),
        region: dict[str, slice] | None = None,
        convert_layout: bool = False,
        fetch_threads: int | None = None,
        west: float | None = None,
        local_cache: str | None = None,
    ) -> None:
        self.store, self.capacity, self.storage_options = store, capacity, storage_options
        self.local_cache = local_cache
        self.convert_layout, self.west = convert_layout, west
        self.variables, self.region = list(variables), dict(region or {})
        # Chunks missing from a batch are fetched concurrently from a remote store (latency, not bandwidth, bounds
        # one chunk at a time); a local store reads them in turn.
        self.fetch_threads = (
            fetch_threads if fetch_threads is not None else (REMOTE_FETCH_THREADS if is_url(store) else 1)
        )
        self._pool: Any = None
        self._ds: xr.Dataset | None = None
        self._pid: int | None = None
        self._bounds: dict[str, np.ndarray] = {}
        self._files: dict[str, ChunkFiles | None] = {}
        self._whole: xr.Dataset | None = None  # the store as read, before the region
        self._as_stored = False
        # An OrderedDict, not cachetools.LRUCache: a read may need more chunks than ``capacity`` (all are kept until
        # its fields are assembled), and the bookkeeping costs half as much (benchmarks/library_speed.py chunk_lru).
        self._lru: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
        self.reads, self.hits, self.loaded, self.bytes_read = 0, 0, [], 0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(
            _ds=None,
            _pid=None,
            _pool=None,
            _bounds={},
            _files={},
            _whole=None,
            _lru=OrderedDict(),
            reads=0,
            hits=0,
            loaded=[],
            bytes_read=0,
        )
        return state

    def dataset(self) -> xr.Dataset:
        """This process's handle on the store (xarray's lazy backend arrays), opened on first use. Chunks are read
        without dask, whose graph costs as much as the read of a 4 MiB chunk (and of a converted archive's
        1.3 M-step axis, minutes); a converted layout is read through index arrays, as one selection per chunk."""
        if self._ds is None or self._pid != os.getpid():
            stored = open_store(self.store, self.variables or None, self.storage_options, self.convert_layout, False)
            ds = columns_as_read(stored, self.west)  # the same object where no column moved
            self._as_stored = ds is stored and not self.convert_layout and not is_url(self.store)
            self._whole, self._ds = ds, ds.isel(self.region) if self.region else ds
            self._pid, self._lru, self._bounds, self._files, self._pool = os.getpid(), OrderedDict(), {}, {}, None
        return self._ds

    def chunk_files(self, variable: str) -> ChunkFiles | None:
        """The direct reader of ``variable``'s chunk files, or ``None`` where zarr reads them."""
        self.dataset()
        if variable not in self._files:
            assert self._whole is not None
            var = self._whole[variable]
            files = None
            if self._as_stored:
                dims = tuple(map(str, var.dims))
                files = ChunkFiles.of(self.store, variable, dims, var.shape, self.region, self.local_cache)
            if files is not None and files.shape[0] != time_chunk(var):
                files = None
            if files is None and self.local_cache is not None:
                warnings.warn(
                    f"store.local_cache: {variable!r} of {self.store} is read through zarr (a URL store, chunks in "
                    "space, a converted layout or CF-encoded values), so its chunks are not copied to "
                    f"{self.local_cache}; for a URL store, prefix it with 'simplecache::' instead (docs/data.md).",
                    stacklevel=2,
                )
            self._files[variable] = files
        return self._files[variable]

    def _steps(self, variable: str, a: int, b: int) -> np.ndarray:
        """Time steps ``[a, b)`` (within one stored chunk) of ``variable`` from the store."""
        files = self.chunk_files(variable)
        if files is not None:
            return files.read(a, b)
        return np.asarray(self.dataset()[variable].variable[a:b].values)

    def _fetch(self, jobs: list[tuple[str, int]]) -> list[np.ndarray]:
        """The chunks ``[(variable, chunk)]`` as arrays, read concurrently by this process's threads (created
        after a fork into a DataLoader worker; dask's own pool would not survive it)."""
        self.dataset()

        def one(job: tuple[str, int]) -> np.ndarray:
            variable, c = job
            bounds = self.bounds(variable)
            return self._steps(variable, int(bounds[c]), int(bounds[c + 1]))

        if self.fetch_threads <= 1 or len(jobs) == 1:
            return [one(job) for job in jobs]
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(self.fetch_threads, thread_name_prefix="gridtnp-chunks")
        return list(self._pool.map(one, jobs))

    def bounds(self, variable: str) -> np.ndarray:
        """Chunk boundaries along time ``[C + 1]`` of ``variable``: chunk ``c`` holds steps ``[b[c], b[c + 1])``."""
        if variable not in self._bounds:
            var = self.dataset()[variable]
            self._bounds[variable] = np.append(np.arange(0, var.sizes["time"], time_chunk(var)), var.sizes["time"])
        return self._bounds[variable]

    def _failing_chunk(
        self, spans: list[tuple[str, list[int], np.ndarray]], err: Exception
    ) -> tuple[str, int | str, Exception]:
        """After a failed read of several chunks: the first one that fails on its own (the error path only)."""
        for variable, chunks, bounds in spans:
            for c in chunks:
                try:
                    self._steps(variable, int(bounds[c]), int(bounds[c + 1]))
                except Exception as own:
                    return variable, c, own
        return spans[0][0], ", ".join(str(c) for c in spans[0][1]), err

    def read(self, requests: Sequence[tuple[str, np.ndarray]]) -> list[np.ndarray]:
        """``[(variable, time index [T])]`` -> ``[fields [T, H, W]]``, reading each missing chunk once; requests for
        the same variable and steps share one array (treat the fields as read-only)."""
        self.dataset()
        located = []
        for variable, index in requests:
            bounds = self.bounds(variable)
            chunk = np.searchsorted(bounds, index, side="right") - 1
            located.append((variable, index, chunk, bounds))
        needed = dict.fromkeys((v, int(c)) for v, _, chunks, _ in located for c in np.unique(chunks))
        missing = [key for key in needed if key not in self._lru]
        self.hits += len(needed) - len(missing)
        if missing:
            try:
                computed = self._fetch(missing)
            except Exception as err:  # a truncated / corrupt chunk, a dropped connection, a missing chunk file
                spans = [
                    (v, [c for w, c in missing if w == v], self.bounds(v)) for v in dict.fromkeys(v for v, _ in missing)
                ]
                variable, chunk, err = self._failing_chunk(spans, err)
                raise DataError(
                    f"{self.store}: reading {variable!r} time chunks [{chunk}] failed ({type(err).__name__}: {err}). "
                    "The store may be truncated or corrupt: re-run `gridtnp data prepare ... --overwrite`, or "
                    "check the connection for a URL."
                ) from err
            for key, data in zip(missing, computed, strict=True):
                self._lru[key] = np.asarray(data, dtype=np.float32)
                self.bytes_read += int(np.asarray(data).nbytes)
            self.reads += len(missing)
            self.loaded.extend(missing)
        for key in needed:
            self._lru.move_to_end(key)
        out, made = [], {}
        for variable, index, chunk, bounds in located:
            key = (variable, index.tobytes())
            if key in made:  # the same steps asked twice (e.g. the station variable at the grid's hour): one array
                out.append(made[key])
                continue
            first = self._lru[(variable, int(chunk[0]))]
            field = np.empty((len(index), *first.shape[1:]), dtype=np.float32)
            if len(index) <= 64:  # a batch's handful of steps: copied straight in, one step at a time
                for i, (c, t) in enumerate(zip(chunk.tolist(), (index - bounds[chunk]).tolist(), strict=True)):
                    field[i] = self._lru[(variable, c)][t]
            else:
                for c in np.unique(chunk):  # a loop over chunks, each filled by one fancy index
                    sel = chunk == c
                    field[sel] = self._lru[(variable, int(c))][index[sel] - bounds[c]]
            made[key] = field
            out.append(field)
        while len(self._lru) > max(self.capacity, len(needed)):
            self._lru.popitem(last=False)
        return out
