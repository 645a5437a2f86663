"""Where a model's time goes: stage times and a ``torch.profiler`` table of the top operators by self time.

    python benchmarks/profile_model.py gp2d_swin_pt --fwdbwd                    # a recipe (recipes/NAME.yaml or a path)
    python benchmarks/profile_model.py cnp --fwd --nc 1000 --nt 100             # a preset (gridtnp list model)
    python benchmarks/profile_model.py gp2d_convcnp --fwdbwd --compile --threads 2

Workload (by default that of ``perf_vs_ref.py``): float32, batch ``--batch`` (2), ``--nc`` context points
(10,000) per source and ``--nt`` targets (1,000), ``x`` uniform in the model grid's bounds (``[-2, 2]^Dx``
without a grid), ``y`` standard normal. ``--fwd``: eval mode under ``torch.no_grad()``; ``--fwdbwd``
(default): train mode,
``-log_prob(y_t).mean()`` and ``backward()``. After ``--warmup`` calls, ``--steps`` calls are timed (the median
is printed, with the median number of minor page faults per call: fresh memory the process touched, which costs
several microseconds a page on a virtual machine), then the same number run under forward hooks on the model's
top-level stages (encoders, grid encoder, processor, grid decoder, likelihood: forward time each) and under
``torch.profiler`` (top ``--top`` operators by self CPU time, and self CUDA time on a GPU). Shapes per operator
with ``--shapes``.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    # Run as a script, this file's folder comes first on sys.path and would shadow the standard library's
    # ``profile`` (which cProfile, imported by torch, needs): put the folder last instead.
    sys.path.append(str(_HERE))
    sys.path.pop(0)

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import harness  # noqa: E402
import torch  # noqa: E402
from forward_time import Workload, make_call, model_box, model_from_preset, model_from_recipe  # noqa: E402
from torch.profiler import ProfilerActivity  # noqa: E402
from torch.profiler import profile as torch_profile  # noqa: E402

from gridtnp import count_parameters  # noqa: E402
from gridtnp.models.neural_process import NeuralProcess  # noqa: E402


def build(name: str) -> NeuralProcess:
    """A recipe (a path, or ``recipes/NAME[.yaml]``) or else a registered preset."""
    path = Path(name)
    for candidate in (path, harness.ROOT / "recipes" / name, harness.ROOT / "recipes" / f"{name}.yaml"):
        if candidate.suffix == ".yaml" and candidate.is_file():
            return model_from_recipe(candidate)
    try:
        return model_from_preset(name, None, None)
    except (KeyError, ValueError) as err:
        raise SystemExit(f"{name!r} is neither a recipe (recipes/*.yaml or a path) nor a preset: {err}") from err


def stage_times(model: NeuralProcess, call, steps: int) -> dict[str, float]:
    """Forward milliseconds per call of each top-level child module (forward hooks), over ``steps`` calls."""
    times: dict[str, float] = {}
    handles = []
    for name, child in model.named_children():
        # One stage per context source's encoder, one per other child.
        named = [(f"encoders.{s}", e) for s, e in child.named_children()] if name == "encoders" else [(name, child)]
        for full, module in named:

            def pre(_m, _i, full=full):
                times[full] = times.get(full, 0.0) - time.perf_counter()

            def post(_m, _i, _o, full=full):
                times[full] += time.perf_counter()

            handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    for _ in range(steps):
        call()
    for h in handles:
        h.remove()
    return {k: 1e3 * v / steps for k, v in times.items()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="recipe (recipes/NAME.yaml, NAME, or a path) or preset name")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--fwd", dest="kind", action="store_const", const="forward", help="forward only (no grad)")
    kind.add_argument("--fwdbwd", dest="kind", action="store_const", const="forward+backward", help="the default")
    parser.set_defaults(kind="forward+backward")
    parser.add_argument("--nc", type=int, default=10_000, help="context points per source")
    parser.add_argument("--nt", type=int, default=1_000, help="target points")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model first")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (CPU)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="timed, hooked and profiled calls each")
    parser.add_argument("--top", type=int, default=25, help="operators in the table")
    parser.add_argument("--shapes", action="store_true", help="group the table by input shapes too")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available here; use --device cpu")
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = build(args.model).to(device)
    workload = Workload({name: args.nc for name in model.encoders}, args.nt, model_box(model))
    context, xt = workload.build(model, args.batch, device)
    runner = harness.maybe_compile(model, args.compile)
    call = make_call(args.kind, model, runner, context, xt, args.bf16)

    for _ in range(args.warmup):
        call()
    times, faults = [], []
    for _ in range(args.steps):
        harness.synchronize(device)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        call()
        harness.synchronize(device)
        times.append(1e3 * (time.perf_counter() - start))
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(
        f"# {args.model} {args.kind}: {statistics.median(times):.1f} ms per call (median of {args.steps}; "
        f"{statistics.median(faults):,.0f} minor page faults per call; "
        f"{count_parameters(model):,} parameters; batch {args.batch}, N_c {args.nc}, N_t {args.nt}; "
        f"{args.device}, {torch.get_num_threads()} threads, {'bf16' if args.bf16 else 'float32'}, "
        f"{'compiled' if args.compile else 'eager'}; torch {torch.__version__}; commit {harness.git_commit()})"
    )
    print("\n## forward time per stage (ms per call, forward hooks)")
    for name, ms in stage_times(model, call, args.steps).items():
        print(f"  {name:40s} {ms:9.1f}")

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=activities, record_shapes=args.shapes) as prof:
        for _ in range(args.steps):
            call()
        harness.synchronize(device)
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    where = "CUDA" if device.type == "cuda" else "CPU"
    print(f"\n## top {args.top} operators by self {where} time ({args.steps} calls)")
    table = prof.key_averages(group_by_input_shape=args.shapes)
    print(table.table(sort_by=sort, row_limit=args.top, max_name_column_width=60))


if __name__ == "__main__":
    main()
