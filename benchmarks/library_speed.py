"""Time of the GP conditioning's three users, and of hand-written pieces against the kept libraries that could
replace them (filelock, cachetools: skipped when not installed).

    python benchmarks/library_speed.py                                # this tree
    PYTHONPATH=<older checkout> python benchmarks/library_speed.py    # the same cases on an older commit

Cases (median of ``--repeats`` runs, forward and backward where the piece is trained, one CPU thread):

* ``kriging``: the model's ``kriging`` slot, ``condition`` + ``forward`` on 8 tasks of 200 context stations and
  500 targets (float32, the demo recipe's rank 16 on the sample's 33 x 49 lattice);
* ``mos_kriging``: ``gp_posterior`` of ``mos_kriging`` in float64 on the same sizes;
* ``departures``: the residual's interpolation with ``departures`` (k 8) on 8 tasks of 400 grid points, 200
  stations and 500 targets;
* ``cholesky`` / ``cholesky_jitter``: ``jittered_cholesky`` of the synthetic GP tasks on 16 covariances of 256
  points in float64 (factorised as they are) / in float32 (every one needs more jitter);
* ``lock`` / ``filelock``: 100 takes and releases of ``gridtnp.locks.take_lock`` / of a bare ``filelock.FileLock``;
* ``chunk_lru`` / ``cachetools_lru``: the chunk cache's LRU bookkeeping for 10,000 reads of 8 chunks, with an
  ``OrderedDict`` (``gridtnp.data.chunk_cache``) / with ``cachetools.LRUCache``;
* ``http_server``: 200 ``Range`` GETs of 4 KiB, 8 at a time, from ``tests.http_server.LocalHTTPServer``.

Cases whose module is absent in the tree imported are skipped. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
import urllib.request
import warnings
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch.distributions import Normal

GRID = {"lower": [50.0, -10.0], "upper": [58.0, 2.0], "shape": [33, 49]}


def points(b: int, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[b, n, 2]`` uniform points over the sample's box."""
    return torch.stack([50 + 8 * torch.rand(b, n, dtype=dtype), -10 + 12 * torch.rand(b, n, dtype=dtype)], -1)


def kriging_case() -> Callable[[], None]:
    from gridtnp.nn.kriging import ResidualKriging

    layer = ResidualKriging("stations", 2, 1, {"stations": 1}, grid=GRID, rank=16, lr_scale=100)
    xc, yc, xt = points(8, 200), torch.randn(8, 200, 1), points(8, 500)
    valid = torch.rand(8, 200) > 0.1
    context = Normal(torch.randn(8, 200, 1), torch.rand(8, 200, 1) + 0.5)
    dist = Normal(torch.randn(8, 500, 1), torch.rand(8, 500, 1) + 0.5)

    def run() -> None:
        out = layer(layer.condition(xc, yc, valid, context), xt, dist)
        out.log_prob(torch.zeros_like(out.mean)).mean().backward()

    return run


def mos_case() -> Callable[[], None]:
    from gridtnp.nn.grid_decoders.mos import MOSKrigingDecoder, gp_posterior

    decoder = MOSKrigingDecoder(GRID, sources=["grid", "stations"], lengthscale=0.5, outputscale=0.5, noise=0.1)
    xc, rc, xt = points(8, 200, torch.float64), torch.randn(8, 200, dtype=torch.float64), points(8, 500, torch.float64)
    mask = torch.rand(8, 200) > 0.1

    def run() -> None:
        mean, var = gp_posterior(decoder.kernel, decoder.log_noise.exp().double(), xc, rc, mask, xt)
        (mean.sum() + var.sum()).backward()

    return run


def departures_case() -> Callable[[], None]:
    from gridtnp.nn.residuals import InterpolationResidual

    residual = InterpolationResidual(
        ["grid"], 1, {"grid": 1, "stations": 1}, k=9, departures={"source": "stations", "k": 8}
    )
    valid = torch.rand(8, 200) > 0.1
    context = {
        "grid": (points(8, 400), torch.randn(8, 400, 1), torch.ones(8, 400, dtype=torch.bool)),
        "stations": (points(8, 200), torch.randn(8, 200, 1), valid),
    }
    xt = points(8, 500)

    def run() -> None:
        mean, features, _ = residual(context, xt)
        (mean.sum() + features.sum()).backward()

    return run


def cholesky_cases(dtype: torch.dtype) -> Callable[[], None]:
    from gridtnp.data.synthetic.gp_kernels import jittered_cholesky

    x = torch.rand(16, 256, 1, dtype=dtype) * 4
    cov = torch.exp(-0.5 * torch.cdist(x, x).square() / 0.5**2)

    def run() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            jittered_cholesky(cov, 1e-6)

    return run


def lock_case() -> Callable[[], None]:
    from gridtnp.locks import release_lock, take_lock

    path = Path(tempfile.mkdtemp()) / "bench.lock"

    def run() -> None:
        for _ in range(100):
            release_lock(take_lock(path))

    return run


def filelock_case() -> Callable[[], None]:
    from filelock import FileLock

    path = Path(tempfile.mkdtemp()) / "bench.lock"

    def run() -> None:  # the kept library alone: no owner line, no stale-lock check, the file left in place
        for _ in range(100):
            lock = FileLock(path, timeout=0)
            lock.acquire()
            lock.release()

    return run


def lru_reads(cache: Any, capacity: int) -> None:
    """The chunk cache's bookkeeping for 10,000 reads of 8 chunks each out of 100, ``cache`` an LRU mapping."""
    rng = random.Random(0)
    for _ in range(10_000):
        needed = dict.fromkeys(("t2m", rng.randrange(100)) for _ in range(8))
        if isinstance(cache, OrderedDict):  # gridtnp.data.chunk_cache.ChunkCache.read's own steps
            for key in needed:
                if key not in cache:
                    cache[key] = key
            for key in needed:
                cache.move_to_end(key)
            _ = [cache[key] for key in needed]
            while len(cache) > max(capacity, len(needed)):
                cache.popitem(last=False)
        else:  # the same with cachetools.LRUCache, the needed chunks held aside (a read may need more than fit)
            held = {key: cache[key] for key in needed if key in cache}
            for key in needed:
                held.setdefault(key, key)
            _ = [held[key] for key in needed]
            for key in needed:
                cache[key] = held[key]


def chunk_lru_case() -> Callable[[], None]:
    return lambda: lru_reads(OrderedDict(), 64)


def cachetools_lru_case() -> Callable[[], None]:
    import cachetools

    return lambda: lru_reads(cachetools.LRUCache(maxsize=64), 64)


def http_case() -> Callable[[], None]:
    if not any(Path(p, "tests", "http_server.py").exists() for p in sys.path):
        sys.path.append(str(Path(__file__).resolve().parents[1]))  # the test tools of this checkout
    from tests.http_server import LocalHTTPServer

    folder = Path(tempfile.mkdtemp())
    (folder / "blob").write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    server = LocalHTTPServer(folder).__enter__()
    url = server.url("blob")

    def get(i: int) -> bytes:
        start = 4096 * (i % 256)
        request = urllib.request.Request(url, headers={"Range": f"bytes={start}-{start + 4095}"})
        with urllib.request.urlopen(request) as response:
            return response.read()

    def run() -> None:
        with ThreadPoolExecutor(8) as pool:
            assert all(len(body) == 4096 for body in pool.map(get, range(200)))

    return run


CASES = {
    "kriging": kriging_case,
    "mos_kriging": mos_case,
    "departures": departures_case,
    "cholesky": lambda: cholesky_cases(torch.float64),
    "cholesky_jitter": lambda: cholesky_cases(torch.float32),
    "lock": lock_case,
    "filelock": filelock_case,
    "chunk_lru": chunk_lru_case,
    "cachetools_lru": cachetools_lru_case,
    "http_server": http_case,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| case | median ms | min ms |\n|---|---|---|")
    for name in args.cases:
        torch.manual_seed(0)
        try:
            run = CASES[name]()
        except (ImportError, TypeError) as error:
            print(f"| {name} | skipped: {error} | |")
            continue
        run()  # warm-up
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            run()
            times.append(1e3 * (time.perf_counter() - start))
        print(f"| {name} | {statistics.median(times):.3f} | {min(times):.3f} |")


if __name__ == "__main__":
    main()
