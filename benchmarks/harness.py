"""Shared timing, memory and reporting code of the benchmark scripts in ``benchmarks/``.

``measure`` times a call (synchronising on CUDA) and records its peak memory; ``Report`` collects result rows and
writes them as a Markdown table, a CSV and a PNG plot, each recording the command, device, torch version,
precision, eager or compiled, git commit and load average. ``add_common_arguments`` gives every script the same
``--device``, ``--bf16``, ``--compile``, ``--threads``, ``--small``, ``--repeats``, ``--warmup``, ``--out`` options.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import math
import os
import platform
import re
import resource
import shlex
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from gridtnp.nn.chunking import release_cpu_memory
from gridtnp.training.compiling import CompiledModel

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


# ------------------------------------------------------------------------------------------------------ measuring


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
        release_cpu_memory()  # return freed heap pages so RSS reflects live memory
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


def predict_ms(history: list[tuple[float, float]], size: float, max_power: float = 2.0) -> float:
    """Time per call at ``size`` extrapolated from smaller sizes: growth exponent from the last two, in
    ``[1, max_power]``; 0 without history."""
    if not history:
        return 0.0
    (s_last, t_last), power = history[-1], 1.0
    if len(history) > 1 and s_last != history[-2][0] and t_last > 0 and history[-2][1] > 0:
        power = math.log(t_last / history[-2][1]) / math.log(s_last / history[-2][0])
    return t_last * (size / s_last) ** min(max(power, 1.0), max_power)


def autocast(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` when ``bf16``, else a no-op."""
    return torch.autocast(device.type, torch.bfloat16, enabled=bf16)


def free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------- arguments


def add_common_arguments(parser: argparse.ArgumentParser, default_out: str) -> None:
    """``--device --bf16 --compile --threads --small --repeats --warmup --max-call-seconds --out``."""
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--bf16", action="store_true", help="bf16 autocast (on the CPU too, where it is usually slower)"
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile the model first")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (CPU); default: torch's choice")
    parser.add_argument("--small", action="store_true", help="smoke-test sizes that finish on a CPU in minutes")
    parser.add_argument("--repeats", type=int, help="timed calls per configuration")
    parser.add_argument("--warmup", type=int, help="untimed calls first")
    parser.add_argument(
        "--max-call-seconds",
        type=float,
        default=120.0,
        help="skip a configuration predicted (from smaller ones) to take longer than this per call; after a call\n"
        "slower than this, stop repeating it and skip the larger ones of that model",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help=f"Markdown output (default benchmarks/results/{default_out}_<device>[_small].md); a CSV and a PNG\n"
        "with the same stem are written next to it",
    )


def finish_common_arguments(
    parser: argparse.ArgumentParser, args: argparse.Namespace, default_out: str, repeats: tuple[int, int]
) -> None:
    """Defaults that depend on ``--small`` (``repeats`` = (small, full); warm-up 1 / 3), checks, ``--out``."""
    small_repeats, full_repeats = repeats
    if args.repeats is None:
        args.repeats = small_repeats if args.small else full_repeats
    if args.warmup is None:
        args.warmup = 1 if args.small else 3
    if args.repeats < 1 or args.warmup < 0:
        parser.error("--repeats must be >= 1 and --warmup >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available in this torch build / machine; use --device cpu")
    if args.bf16 and args.device == "cpu":
        warnings.warn("--bf16 on the CPU: autocast runs, but is usually slower than float32.", stacklevel=1)
    if args.out is None:
        args.out = RESULTS / f"{default_out}_{args.device}{'_small' if args.small else ''}.md"
    if args.threads:
        torch.set_num_threads(args.threads)


def maybe_compile(module: torch.nn.Module, enabled: bool) -> Callable[..., Any]:
    """``module`` itself, or with ``enabled`` its ``torch.compile`` (eager with one warning where that fails)."""
    return CompiledModel(module) if enabled else module


# ------------------------------------------------------------------------------------------------------ reporting


def repo_env() -> dict[str, str]:
    """This environment with the repository first on ``PYTHONPATH``, for a subprocess that runs gridtnp's code
    (what is importable now stays importable there)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def short_commit(folder: Path) -> str | None:
    """The short commit of the git checkout whose top level is ``folder`` (not of a checkout around it), or None."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel", "--short", "HEAD"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != Path(folder).resolve():
        return None
    return lines[1]


def git_commit() -> str:
    """Short commit hash, with ``+dirty`` for uncommitted changes to tracked files (other than result files and
    documentation, which change no measured code); or why there is none."""
    head = short_commit(ROOT)
    if head is None:
        return "unavailable (not a git checkout of its own, or no commits yet)"
    paths = ["--", ".", ":(exclude)benchmarks/results", ":(exclude)docs", ":(exclude)*.md"]
    diff = subprocess.run(["git", "diff", "--quiet", "HEAD", *paths], cwd=ROOT, capture_output=True, timeout=10)
    return head + ("+dirty" if diff.returncode else "")


def cpu_info() -> dict[str, str]:
    """The CPU's model name, vendor (``GenuineIntel``, ``AuthenticAMD``, ...) and widest vector extension."""
    info = {"model": platform.processor() or platform.machine(), "vendor": "unknown", "isa": "unknown"}
    with contextlib.suppress(OSError):
        text = Path("/proc/cpuinfo").read_text()
        for key, field in (("model", "model name"), ("vendor", "vendor_id")):
            match = re.search(rf"^{field}\s*:\s*(.+)$", text, re.MULTILINE)
            if match:
                info[key] = match.group(1).strip()
        line = re.search(r"^flags\s*:\s*(.+)$", text, re.MULTILINE)
        flags = set(line.group(1).split()) if line else set()
        info["isa"] = next((name for flag, name in _ISA if flag in flags), "unknown")
    return info


_ISA = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sse4_2", "SSE4.2"))


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU model with its vendor, vector extension and the number of torch threads."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = cpu_info()
    return f"CPU: {cpu['model']} ({cpu['vendor']}, {cpu['isa']}), {torch.get_num_threads()} torch threads"


def relative(path: str | Path) -> str:
    """``path`` relative to the repository root (or the working directory); never a machine's absolute path."""
    path = Path(path)
    if not path.is_absolute():
        return str(path)
    for base in (ROOT, Path.cwd()):
        with contextlib.suppress(ValueError):
            return str(path.resolve().relative_to(base.resolve()))
    return path.name


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that ran, ``python`` plus the script and its arguments, with absolute paths made relative."""
    argv = list(sys.argv if argv is None else argv)
    words = [relative(a) if a.startswith("/") else a for a in argv]
    return "python " + " ".join(shlex.quote(w) for w in words)


def run_record(device: torch.device) -> dict[str, str]:
    """What every result records about its run: commit, command, hardware and torch version (no paths)."""
    return {
        "commit": git_commit(),
        "command": command_line(),
        "hardware": device_name(device),
        "torch": torch.__version__,
    }


def metadata(args: argparse.Namespace, device: torch.device, **extra: str) -> dict[str, str]:
    """What every result file records: command, device, torch, precision, compile, commit, timing, load."""
    meta = {
        "command": command_line(),
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
    }
    meta.update(extra)
    return meta


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


class Report:
    """Rows (dicts with the same keys) plus metadata, written as Markdown, CSV and (by the caller) a PNG plot."""

    def __init__(self, title: str, meta: dict[str, str], notes: Sequence[str] = ()) -> None:
        self.title, self.meta, self.notes = title, meta, list(notes)
        self.rows: list[dict[str, Any]] = []

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    def markdown(self, columns: dict[str, Callable[[dict[str, Any]], str]]) -> str:
        """A Markdown document: title, metadata, notes, then one table row per result row."""
        lines = [f"# {self.title}", ""]
        lines += [f"- {key}: {value}" for key, value in self.meta.items()]
        if self.notes:
            lines += ["", *self.notes]
        lines += ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(cell(row) for cell in columns.values()) + " |" for row in self.rows]
        return "\n".join(lines) + "\n"

    def write(self, out: Path, columns: dict[str, Callable[[dict[str, Any]], str]]) -> list[Path]:
        """Write ``out`` (Markdown) and ``out.with_suffix('.csv')``; return both paths."""
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(self.markdown(columns))
        path = out.with_suffix(".csv")
        keys = list(dict.fromkeys(k for row in self.rows for k in row))
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=[*keys, *self.meta])
            writer.writeheader()
            for row in self.rows:
                writer.writerow({**row, **self.meta})
        return [out, path]


def write_table(out: Path, title: str, meta: dict[str, str], rows: list[dict[str, Any]]) -> list[Path]:
    """``rows`` as a Markdown table (one column per key, integers with thousands separators) and a CSV."""
    report = Report(title, meta)
    for row in rows:
        report.add(row)

    def cell(key: str) -> Callable[[dict[str, Any]], str]:
        return lambda row: f"{row[key]:,}" if isinstance(row[key], int) else str(row[key])

    return report.write(out, {key: cell(key) for key in rows[0]})


def line_plot(
    path: Path,
    series: dict[str, list[tuple[float, float]]],
    xlabel: str,
    ylabel: str,
    title: str,
    log_x: bool = True,
    log_y: bool = True,
    panels: dict[str, dict[str, list[tuple[float, float]]]] | None = None,
) -> Path:
    """A PNG of one line per series (``{label: [(x, y), ...]}``); ``panels`` adds more axes ``{ylabel: series}``."""
    from matplotlib.figure import Figure

    all_panels = {ylabel: series, **(panels or {})}
    fig = Figure(figsize=(6.2 * len(all_panels), 4.2), layout="constrained")
    for i, (label_y, lines) in enumerate(all_panels.items(), start=1):
        ax = fig.add_subplot(1, len(all_panels), i)
        for label, points in lines.items():
            points = [(x, y) for x, y in points if y is not None and y > 0]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, "o-", label=label)
        if log_x:
            ax.set_xscale("log")
        if log_y:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label_y)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    path = path.with_suffix(".png")
    fig.savefig(path, dpi=110)
    return path
