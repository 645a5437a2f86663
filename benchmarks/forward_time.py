"""Forward (and forward + backward) time and peak memory of a recipe's or preset's model as the context grows.

    python benchmarks/forward_time.py --recipe recipes/gp2d_convcnp.yaml --num-context 1000 10000 100000
    python benchmarks/forward_time.py --preset tnp --num-context 100 1000 --backward --small
    python benchmarks/forward_time.py --recipe recipes/gp2d_convcnp.yaml --device cuda --bf16 --backward

Inputs are random and shaped like the model's task: ``dim_x`` and each source's ``dim_y`` come from the model,
context and target ``x`` are uniform in the model grid's bounds (``[-2, 2]^Dx`` for grid-free models), ``y`` is
standard normal. Each configuration is run ``--warmup`` times, then timed ``--repeats`` times (synchronising on
CUDA); the median is reported. Results go to a Markdown table and a CSV with the same stem.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import ctypes
import datetime
import math
import os
import platform
import re
import resource
import shlex
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import yaml
from torch import Tensor, nn

from gridtnp import NeuralProcessModule, Observations, count_parameters, create_model
from gridtnp.models.neural_process import NeuralProcess

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Row:
    """One measured configuration."""

    model: str
    params: int
    batch_size: int
    num_context: int
    num_targets: int
    passes: str
    median_ms: float | None
    min_ms: float | None
    peak_mib: float | None
    repeats: int
    note: str = ""


# ----------------------------------------------------------------------------------------------- building models


def model_from_recipe(path: Path) -> NeuralProcess:
    """The ``NeuralProcess`` that ``gridtnp fit --config path`` would train."""
    if not path.is_file():
        raise SystemExit(
            f"--recipe {path}: no such file. Recipes: {', '.join(sorted(map(str, ROOT.glob('recipes/*.yaml'))))}"
        )
    config = yaml.safe_load(path.read_text()) or {}
    init_args = (config.get("model") or {}).get("init_args")
    if not isinstance(init_args, dict):
        raise SystemExit(f"--recipe {path}: expected a 'model: {{init_args: {{...}}}}' section as in recipes/*.yaml.")
    return NeuralProcessModule(**init_args).model


def model_from_preset(name: str, dim_x: int | None, dim_y: int | None) -> NeuralProcess:
    """A registered preset (``gridtnp list model``), optionally with another ``dim_x`` / ``dim_y``."""
    kwargs = {k: v for k, v in {"dim_x": dim_x, "dim_y": dim_y}.items() if v is not None}
    return create_model(name, **kwargs)


# ---------------------------------------------------------------------------------------------------- inputs


def random_x(model: NeuralProcess, b: int, n: int, device: torch.device) -> Tensor:
    """``[b, n, Dx]`` uniform in the model grid's bounds, or in ``[-2, 2]^Dx`` without a grid."""
    grid = model.grid
    lower = torch.tensor(grid.lower if grid is not None else [-2.0] * model.dim_x, device=device)
    upper = torch.tensor(grid.upper if grid is not None else [2.0] * model.dim_x, device=device)
    return lower + (upper - lower) * torch.rand(b, n, model.dim_x, device=device)


def random_context(model: NeuralProcess, b: int, n: int, device: torch.device) -> dict[str, Observations]:
    """``n`` context points for every source the model has an encoder for."""
    return {
        name: Observations(random_x(model, b, n, device), torch.randn(b, n, encoder.dim_y, device=device))
        for name, encoder in model.encoders.items()
    }


# ------------------------------------------------------------------------------------------------ measuring


class PeakMemory:
    """Peak memory above the level when ``start()`` is called, in MiB; ``method`` says how it is measured."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.baseline = 0.0
        self.kind = "cuda" if device.type == "cuda" else "vmhwm" if self._reset_hwm() else "maxrss"
        if self.kind == "cuda":
            self.method = "torch.cuda.max_memory_allocated() minus memory_allocated() before the calls (tensors only)"
        elif self.kind == "vmhwm":
            self.method = (
                "peak RSS (VmHWM, reset through /proc/self/clear_refs) minus RSS before the calls; psutil has no "
                "resettable peak"
            )
        else:
            self.method = (
                "resource.getrusage ru_maxrss growth: a lifetime peak, so 0 when an earlier configuration peaked higher"
            )

    @staticmethod
    def _status_kib(field: str) -> float | None:
        with contextlib.suppress(OSError):
            match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
            return float(match.group(1)) if match else None
        return None

    @staticmethod
    def _reset_hwm() -> bool:
        try:
            Path("/proc/self/clear_refs").write_text("5")  # Linux >= 4.0: resets VmHWM to the current RSS
        except OSError:
            return False
        return PeakMemory._status_kib("VmHWM") is not None

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = torch.cuda.memory_allocated(self.device) / 2**20
            return
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)  # return freed heap pages so RSS reflects live memory
        if self.kind == "vmhwm" and self._reset_hwm():
            self.baseline = (self._status_kib("VmRSS") or 0.0) / 1024
        else:
            self.baseline = self._maxrss_mib()

    def peak(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20 - self.baseline
        if self.kind == "vmhwm":
            return (self._status_kib("VmHWM") or 0.0) / 1024 - self.baseline
        return self._maxrss_mib() - self.baseline

    @staticmethod
    def _maxrss_mib() -> float:
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        return kib / 2**20 if sys.platform == "darwin" else kib / 1024


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    fn: Callable[[], None], device: torch.device, warmup: int, repeats: int, max_call_s: float
) -> tuple[list[float], float, str]:
    """Milliseconds per timed call, peak memory (MiB) over the timed calls, and a note (e.g. stopped early)."""
    memory = PeakMemory(device)
    memory.start()
    times = []
    for i in range(warmup + repeats):
        if i == warmup > 0:
            memory.start()  # one-time allocations of the first calls (kernel caches, lazy init) do not count
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        elapsed = time.perf_counter() - start
        if i >= warmup:
            times.append(elapsed * 1e3)
        if elapsed > max_call_s:  # too slow to repeat: keep this one call as the estimate
            kept = f"{len(times)} timed" if times else "that warm-up call is the estimate"
            return times or [elapsed * 1e3], memory.peak(), f"stopped after a {elapsed:.0f} s call; {kept}"
    return times, memory.peak(), ""


def is_out_of_memory(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and ("out of memory" in str(err) or "can't allocate memory" in str(err))
    )


def make_call(
    kind: str, model: nn.Module, runner: nn.Module, context: dict[str, Observations], xt: Tensor, bf16: bool
) -> Callable[[], None]:
    """One call of ``kind``: ``forward`` (no grad, eval mode) or ``forward+backward`` (train mode)."""
    device_type = xt.device.type
    model.train(kind != "forward")
    if kind == "forward":

        def forward() -> None:
            with torch.no_grad(), torch.autocast(device_type, torch.bfloat16, enabled=bf16):
                runner(context, xt)

        return forward
    yt: list[Tensor] = []  # the targets' y, drawn once the first call tells the output shape

    def forward_backward() -> None:
        model.zero_grad(set_to_none=True)
        with torch.autocast(device_type, torch.bfloat16, enabled=bf16):
            dist = runner(context, xt)
            if not yt:
                yt.append(torch.randn(dist.mean.shape, device=xt.device))
            loss = -dist.log_prob(yt[0]).float().mean()
        loss.backward()

    return forward_backward


def predict_ms(history: list[tuple[int, float]], n_c: int) -> float:
    """Time per call at ``n_c`` extrapolated from smaller ``N_c``: growth exponent from the last two, in [1, 2]."""
    if not history:
        return 0.0
    (n_last, t_last), power = history[-1], 1.0
    if len(history) > 1 and n_last != history[-2][0] and t_last > 0 and history[-2][1] > 0:
        power = math.log(t_last / history[-2][1]) / math.log(n_last / history[-2][0])
    return t_last * (n_c / n_last) ** min(max(power, 1.0), 2.0)


def benchmark_model(label: str, model: NeuralProcess, args: argparse.Namespace, device: torch.device) -> list[Row]:
    """Rows for every ``N_c`` (and pass) of one model; larger ``N_c`` are skipped after an OOM or a slow call."""
    model = model.to(device)
    params = count_parameters(model)
    runner: nn.Module = torch.compile(model) if args.compile else model
    passes = ["forward", "forward+backward"] if args.backward else ["forward"]
    stopped: dict[str, str] = {}
    history: dict[str, list[tuple[int, float]]] = {kind: [] for kind in passes}
    rows = []
    for n_c in args.num_context:
        torch.manual_seed(0)
        context = random_context(model, args.batch_size, n_c, device)
        xt = random_x(model, args.batch_size, args.num_targets, device)
        for kind in passes:
            row = Row(label, params, args.batch_size, n_c, args.num_targets, kind, None, None, None, 0)
            predicted = predict_ms(history[kind], n_c)
            if kind not in stopped and predicted > 1e3 * args.max_call_seconds:
                stopped[kind] = f"skipped: predicted {predicted / 1e3:,.0f} s per call > --max-call-seconds"
            if kind in stopped:
                row.note = stopped[kind]
            else:
                call = make_call(kind, model, runner, context, xt, args.bf16)
                try:
                    times, row.peak_mib, row.note = measure(
                        call, device, args.warmup, args.repeats, args.max_call_seconds
                    )
                    row.median_ms, row.min_ms, row.repeats = statistics.median(times), min(times), len(times)
                    history[kind].append((n_c, row.median_ms))
                    if row.note:
                        stopped[kind] = f"skipped: N_c = {n_c:,} was already too slow"
                except Exception as err:
                    if not is_out_of_memory(err):
                        raise
                    row.note, stopped[kind] = "out of memory", f"skipped: out of memory at N_c = {n_c:,}"
                del call
                model.zero_grad(set_to_none=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            rows.append(row)
            print(format_row(row), flush=True)
    return rows


# --------------------------------------------------------------------------------------------------- reporting


def git_commit() -> str:
    """Short commit hash, with ``+dirty`` for uncommitted changes to tracked files; or why there is none."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "unavailable (no git)"
    if head.returncode != 0:
        return "unavailable (not a git checkout, or no commits yet)"
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=ROOT, capture_output=True, timeout=10).returncode
    return head.stdout.strip() + ("+dirty" if dirty else "")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        match = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
        cpu = match.group(1).strip() if match else cpu
    return f"CPU: {cpu}, {torch.get_num_threads()} torch threads"


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


HEADER = ("model", "params", "B", "N_c", "N_t", "pass", "median ms", "min ms", "x first N_c", "peak MiB", "note")


def table_cells(row: Row, first: float | None) -> list[str]:
    ratio = None if row.median_ms is None or not first else row.median_ms / first
    return [
        row.model,
        f"{row.params:,}",
        str(row.batch_size),
        f"{row.num_context:,}",
        f"{row.num_targets:,}",
        row.passes,
        _fmt(row.median_ms),
        _fmt(row.min_ms),
        _fmt(ratio, 2),
        _fmt(row.peak_mib),
        row.note,
    ]


def format_row(row: Row) -> str:
    return (
        f"{row.model:>24} | B={row.batch_size} N_c={row.num_context:>7,} N_t={row.num_targets:,} | {row.passes:>16} | "
        f"median {_fmt(row.median_ms):>10} ms | peak {_fmt(row.peak_mib):>8} MiB {row.note}"
    )


def markdown(rows: list[Row], meta: dict[str, str]) -> str:
    """The results as a Markdown document: metadata, then one table row per configuration."""
    firsts: dict[tuple[str, str], float | None] = {}
    for row in rows:
        firsts.setdefault((row.model, row.passes), row.median_ms)
    lines = ["# Forward time", ""]
    lines += [f"- {key}: {value}" for key, value in meta.items()]
    lines += ["", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(table_cells(r, firsts[(r.model, r.passes)])) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_csv(path: Path, rows: list[Row], meta: dict[str, str]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*asdict(rows[0]), *meta])
        writer.writeheader()
        for row in rows:
            writer.writerow({**asdict(row), **meta})


# -------------------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    what = parser.add_argument_group("models (at least one)")
    what.add_argument(
        "--recipe", nargs="+", type=Path, default=[], help="recipe YAML file(s), e.g. recipes/gp2d_convcnp.yaml"
    )
    what.add_argument("--preset", nargs="+", default=[], help="model preset name(s) (gridtnp list model)")
    what.add_argument("--dim-x", type=int, help="dim_x for presets (default: the preset's)")
    what.add_argument("--dim-y", type=int, help="dim_y for presets (default: the preset's)")
    parser.add_argument("--batch-size", type=int, help="default 8 (2 with --small)")
    parser.add_argument("--num-context", type=int, nargs="+", help="N_c values; default 1000 10000 100000")
    parser.add_argument("--num-targets", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, help="timed calls per configuration; default 10 (2 with --small)")
    parser.add_argument("--warmup", type=int, help="untimed calls first; default 3 (1 with --small)")
    parser.add_argument("--backward", action="store_true", help="also time forward + backward of the log-likelihood")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (CUDA only; ignored with a warning on CPU)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model first")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (CPU); default: torch's choice")
    parser.add_argument(
        "--max-call-seconds",
        type=float,
        default=120.0,
        help="skip a configuration predicted (from smaller N_c) to take longer than this per call; after a call\n"
        "slower than this, stop repeating and skip larger N_c for that model and pass",
    )
    parser.add_argument(
        "--small", action="store_true", help="smoke run: batch 2, N_c 100 1000 10000, 2 repeats, 1 warm-up"
    )
    parser.add_argument(
        "--out", type=Path, help="Markdown output (default benchmarks/results/forward_time_<device>.md)"
    )
    args = parser.parse_args(argv)
    if not args.recipe and not args.preset:
        parser.error("give --recipe FILE... and/or --preset NAME... (see `gridtnp list model`)")
    # --small only changes what was not given explicitly, so `--small --num-context 100 1000` works.
    small = {"batch_size": 2, "num_context": [100, 1_000, 10_000], "repeats": 2, "warmup": 1}
    full = {"batch_size": 8, "num_context": [1_000, 10_000, 100_000], "repeats": 10, "warmup": 3}
    for key, value in (small if args.small else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if min(args.batch_size, args.num_targets, args.repeats, *args.num_context) < 1 or args.warmup < 0:
        parser.error("--batch-size, --num-context, --num-targets and --repeats must be >= 1, --warmup >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available in this torch build / machine; use --device cpu")
    if args.bf16 and args.device != "cuda":
        warnings.warn("--bf16 is only used on CUDA; timing float32 on the CPU instead.", stacklevel=1)
        args.bf16 = False
    args.out = args.out or ROOT / "benchmarks" / "results" / f"forward_time_{args.device}.md"
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    models: list[tuple[str, Callable[[], NeuralProcess]]] = [
        (path.stem, lambda path=path: model_from_recipe(path)) for path in args.recipe
    ] + [(name, lambda name=name: model_from_preset(name, args.dim_x, args.dim_y)) for name in args.preset]
    meta = {
        "command": "python " + " ".join(shlex.quote(a) for a in [str(Path(sys.argv[0])), *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": device_name(device),
        "torch": torch.__version__,
        "precision": "bf16 autocast" if args.bf16 else "float32",
        "compile": "torch.compile" if args.compile else "eager",
        "commit": git_commit(),
        "timing": f"median of {args.repeats} calls after {args.warmup} warm-up calls"
        + (", torch.cuda.synchronize() around each" if device.type == "cuda" else ""),
        "memory": PeakMemory(device).method + "; over the timed calls",
        "load": f"1-min load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPU cores at the start "
        "(timings are noisy when it exceeds the number of cores)",
        "forward": "torch.no_grad(), model.eval(); forward+backward: model.train(), -log_prob(y_t).mean().backward()",
    }
    print("\n".join(f"{k}: {v}" for k, v in meta.items()), flush=True)
    rows: list[Row] = []
    for label, build in models:
        model = build()
        print(
            f"{label}: {count_parameters(model):,} parameters, dim_x = {model.dim_x}, grid = {model.grid}", flush=True
        )
        rows += benchmark_model(label, model, args, device)
        del model
    text = markdown(rows, meta)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    write_csv(args.out.with_suffix(".csv"), rows, meta)
    print("\n" + text + f"\nwritten: {args.out} and {args.out.with_suffix('.csv')}")


if __name__ == "__main__":
    main()
