"""Speed and memory of gridtnp's models against the public reference implementation, side by side.

The reference is the gridded TNP paper's code, ``smokeStacking/gridded-tnp``; give a checkout of it with
``--reference``. None of its code is copied here: its models are built at run time from its own YAML configs
(``experiments/configs``, merged with HiYaPyCo and instantiated with hydra as its ``experiment_utils`` does), plus
the overrides listed in ``MODELS`` (each with its reason), which align hyperparameters with gridtnp's recipes. Only
its model modules are imported (``tnp/__init__.py``, which pulls in data, wandb and lightning, is bypassed), so the
reference side needs torch, ``check_shapes``, ``einops``, ``hydra-core``, ``omegaconf`` and ``HiYaPyCo``.

Every measurement runs in a fresh child process; passes alternate which side goes first. Workload (identical
tensors on both sides): float32, batch 2, x_c, x_t ~ U[-6, 6]^2, y ~ N(0, 1), N_c = 10,000, N_t = 1,000, 2 threads.
``fwd``: eval mode under ``torch.no_grad()``; ``fwdbwd``: train mode, ``-log_prob(y_t).mean()`` and ``backward()``.
Each child runs ``--warmup`` untimed calls and reports the median of ``--repeats`` timed ones; the table reports the
median over ``--passes`` children. Peak memory: growth of the peak resident set size over the calls (VmHWM after
resetting it through ``/proc/self/clear_refs``; ``ru_maxrss`` growth where that is not writable).

Writes ``--out`` (JSON lines: one ``meta`` record with commit, reference commit, command, hardware and torch
version, then one line per child) and a Markdown table with the same stem::

    python benchmarks/perf_vs_ref.py --reference ../gridded-tnp                     # every default model
    python benchmarks/perf_vs_ref.py --reference ../gridded-tnp --models swin_pt_32 --passes 1 \\
        --scaling-nc --gridtnp-only-nc --out runs/perf_vs_ref_smoke.jsonl           # one model, quick
    python benchmarks/perf_vs_ref.py --tables-only                                  # re-render the Markdown
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "perf_vs_ref_cpu.jsonl"

# ------------------------------------------------------------------------------------------------- model table
# ref_files: YAML files under <reference>/experiments/configs, merged in order (as the reference's --config list).
# ref_set: dotted OmegaConf keys set after merging (replacing whole nodes when the value is a dict).
# gridtnp: a recipe under recipes/ (model.init_args, with gridtnp_set applied), or a preset with keyword arguments.
GP = "generators/gp.yml"
SWIN_PT = ["models/gp/swintnp.yml", "models/grid_encoders/pt-ge.yml", "models/grid_decoders/mhca-gd.yml", GP]
SWIN_KI = ["models/gp/swintnp.yml", "models/grid_encoders/setconv-ge.yml", "models/grid_decoders/mhca-gd.yml", GP]
CONVCNP = ["models/gp/convcnp.yml", "models/cnns/unet.yml", GP]
NEAREST = {"grid_encoder": {"name": "kernel_interpolation", "nearest_only": True}}
MHSA = {
    "_target_": "tnp.networks.attention_layers.MultiHeadSelfAttentionLayer",
    "embed_dim": "${params.embed_dim}",
    "num_heads": "${params.num_heads}",
    "head_dim": "${params.head_dim}",
    "feedforward_dim": "${params.embed_dim}",
    "norm_first": "${params.norm_first}",
}

MODELS: dict[str, dict[str, Any]] = {
    "swin_pt_32": {
        "label": "Swin-TNP PT-GE 32x32",
        "recipe": "gp2d_swin_pt.yaml",
        "ref_files": SWIN_PT,
        "ref_set": {},
        "note": "reference swintnp.yml + pt-ge.yml + mhca-gd.yml as shipped (32x32, window 4, shift 2, 5 layers, k=9)",
    },
    "swin_ki_32": {
        "label": "Swin-TNP KI-GE 32x32",
        "recipe": "gp2d_swin_ki.yaml",
        "ref_files": SWIN_KI,
        "ref_set": {"params.dim_distance": 2},
        "note": "reference setconv-ge.yml needs params.dim_distance (unset in its configs): 2. Reference SetConv "
        "uses use_nn=True (nearest grid point only); gridtnp recipe sums over all grid points",
    },
    "swin_ki_32_nn": {
        "label": "Swin-TNP KI-GE 32x32 (gridtnp nearest_only)",
        "recipe": "gp2d_swin_ki.yaml",
        "gridtnp_set": NEAREST,
        "ref_files": SWIN_KI,
        "ref_set": {"params.dim_distance": 2},
        "note": "gridtnp KI-GE with nearest_only=True, the reference's use_nn=True semantics",
    },
    "swin_pt_64": {
        "label": "Swin-TNP PT-GE 64x64",
        "recipe": "gp2d_swin_pt_64.yaml",
        "ref_files": SWIN_PT,
        "ref_set": {
            "params.grid_encoder_grid_shape": [64, 64],
            "params.window_sizes": [8, 8],
            "params.shift_sizes": [4, 4],
        },
        "note": "reference: grid 64x64, window 8, shift 4 (as the gridtnp recipe)",
    },
    "vit_pt_patch": {
        "label": "ViTNP PT-GE 32->16 patch",
        "recipe": "gp2d_vit_pt_patch.yaml",
        "ref_files": [
            "models/gp/vitnp-pe.yml",
            "models/grid_encoders/pt-ge.yml",
            "models/grid_decoders/mhca-gd.yml",
            GP,
        ],
        "ref_set": {"params.grid_encoder_grid_shape": [32, 32], "params.patch_encoder_grid_shape": [16, 16]},
        "note": "reference vitnp-pe.yml ships 64x64 -> 32x32; set to 32x32 -> 16x16 (2x2 patches) as the recipe",
    },
    "pt_tnp": {
        "label": "PT-TNP (perceiver) M=128",
        "recipe": "gp2d_pt_tnp.yaml",
        "ref_files": ["models/gp/pttnp.yml", GP],
        "ref_set": {
            "ist_encoder": {
                "_target_": "tnp.networks.transformer.PerceiverEncoder",
                "num_latents": 128,
                "mhsa_layer": MHSA,
                "mhca_ctoq_layer": "${mhca_ctoq_layer}",
                "mhca_qtot_layer": "${mhca_qtot_layer}",
                "num_layers": "${params.num_layers}",
            },
        },
        "note": "reference pttnp.yml ships an IST encoder with 256 latents; replaced by its own PerceiverEncoder "
        "with 128 latents (MHCA ctoq, MHSA, MHCA qtot per layer) to match the gridtnp recipe",
    },
    "pt_tnp_ist256": {
        "label": "PT-TNP (IST) M=256",
        "preset": ("pt_tnp_ist", {"dim_x": 2, "dim_y": 1, "num_tokens": 256}),
        "ref_files": ["models/gp/pttnp.yml", GP],
        "ref_set": {},
        "note": "reference pttnp.yml as shipped (IST, 256 latents) vs gridtnp preset pt_tnp_ist num_tokens=256 "
        "(both update the context after every layer but the last)",
    },
    "convcnp": {
        "label": "ConvCNP 32x32 U-Net",
        "recipe": "gp2d_convcnp.yaml",
        "ref_files": CONVCNP,
        "ref_set": {},
        "note": "reference convcnp.yml + unet.yml as shipped (32x32, 5 blocks, 128 channels, 5x5, max-pool, "
        "use_nn SetConv); the two U-Nets differ in design",
    },
    "cnp": {
        "label": "CNP",
        "preset": ("cnp", {"dim_x": 2, "dim_y": 1}),
        "ref_files": ["models/gp/cnp.yml", GP],
        "ref_set": {
            # cnp.yml passes x_encoder to CNPEncoder, which has no such argument: give it to the DeepSet instead
            # (which takes one), and size the decoder for cat[r, raw x_t] as CNPEncoder builds it.
            "cnp_encoder": {"_target_": "tnp.models.cnp.CNPEncoder", "deepset": "${deepset}"},
            "deepset": {
                "_target_": "tnp.networks.deepset.DeepSet",
                "z_encoder": "${z_encoder}",
                "x_encoder": "${x_encoder}",
                "agg": "mean",
            },
            "z_decoder.in_dim": "${eval:'${params.embed_dim} + ${params.dim_x}'}",
            "params.num_layers": 2,
        },
        "note": "reference cnp.yml does not instantiate as shipped (CNPEncoder has no x_encoder); x_encoder moved "
        "into the DeepSet, z_decoder in_dim = 128 + 2, num_layers 5 -> 2 (3 linear layers, as gridtnp's cnp)",
    },
    "convcnp_c108": {
        "label": "ConvCNP 32x32 U-Net (ref 108 ch)",
        "recipe": "gp2d_convcnp.yaml",
        "ref_files": CONVCNP,
        "ref_set": {"params.num_channels": 108},
        "note": "reference U-Net narrowed to 108 channels so its parameter count matches gridtnp's (~2.1 M)",
    },
    "convcnp_nn": {
        "label": "ConvCNP 32x32 U-Net (gridtnp nearest_only)",
        "recipe": "gp2d_convcnp.yaml",
        "gridtnp_set": NEAREST,
        "ref_files": CONVCNP,
        "ref_set": {},
        "note": "gridtnp KI-GE with nearest_only=True, the reference's use_nn=True semantics (reference as shipped)",
        "extra": True,
    },
}
DEFAULT_MODELS = [k for k, v in MODELS.items() if not v.get("extra")]
KINDS = ("fwd", "fwdbwd")


# ---------------------------------------------------------------------------------------------- model builders
def build_gridtnp(name: str) -> tuple[Any, Any]:
    """(model, call) for gridtnp; ``call(xc [B, Nc, 2], yc [B, Nc, 1], xt [B, Nt, 2])`` returns a Normal."""
    import yaml

    import gridtnp
    from gridtnp.batch import Observations

    spec = MODELS[name]
    if "recipe" in spec:
        cfg = yaml.safe_load((ROOT / "recipes" / spec["recipe"]).read_text())
        init_args = {**cfg["model"]["init_args"], **spec.get("gridtnp_set", {})}
        model = gridtnp.NeuralProcessModule(**init_args).model
    else:
        preset, kwargs = spec["preset"]
        model = gridtnp.create_model(preset, **kwargs)

    def call(xc: Any, yc: Any, xt: Any) -> Any:
        return model({"points": Observations(xc, yc)}, xt)

    return model, call


def _reference_stubs(reference: Path) -> None:
    """Make ``tnp.*`` importable without running ``tnp/__init__.py`` (data pipeline, wandb, lightning)."""
    import types

    for name, sub in (("tnp", "tnp"), ("tnp.utils", "tnp/utils"), ("tnp.data", "tnp/data")):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = [str(reference / sub)]
            sys.modules[name] = module
    if str(reference) not in sys.path:
        sys.path.insert(0, str(reference))


def reference_config(name: str, reference: Path) -> Any:
    """The reference's OmegaConf config of model ``name``: its YAML files merged, then ``ref_set`` applied."""
    import hiyapyco
    from omegaconf import OmegaConf

    spec = MODELS[name]
    if not OmegaConf.has_resolver("eval"):
        OmegaConf.register_new_resolver("eval", eval)  # as the reference's experiment_utils does
    files = [str(reference / "experiments" / "configs" / f) for f in spec["ref_files"]]
    raw = hiyapyco.load(files, method=hiyapyco.METHOD_MERGE, usedefaultyamlloader=True)

    def plain(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, list):
            return [plain(v) for v in x]
        return x

    cfg = OmegaConf.create(plain(raw))
    for key, value in spec["ref_set"].items():
        OmegaConf.update(cfg, key, value, merge=False)
    return cfg


def build_reference(name: str, reference: Path) -> tuple[Any, Any]:
    """(model, call) for the reference; ``call(xc, yc, xt)`` returns a Normal."""
    _reference_stubs(reference)
    from hydra.utils import instantiate

    model = instantiate(reference_config(name, reference).model)

    def call(xc: Any, yc: Any, xt: Any) -> Any:
        return model(xc=xc, yc=yc, xt=xt)

    return model, call


# ------------------------------------------------------------------------------------------------- the child
def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def make_inputs(b: int, nc: int, nt: int, seed: int) -> tuple[Any, Any, Any, Any]:
    """xc [b, nc, 2], yc [b, nc, 1], xt [b, nt, 2], yt [b, nt, 1]: x ~ U[-6, 6]^2, y ~ N(0, 1)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    xc = -6.0 + 12.0 * torch.rand(b, nc, 2, generator=g)
    yc = torch.randn(b, nc, 1, generator=g)
    xt = -6.0 + 12.0 * torch.rand(b, nt, 2, generator=g)
    yt = torch.randn(b, nt, 1, generator=g)
    return xc, yc, xt, yt


def calibration_ms(device: Any, repeats: int = 7) -> float:
    """Median time (ms) of a fixed workload with normal values, timed in the same process as a model: an MLP block
    forward and backward on ``[2048, 256]`` float32. ``--check`` without the reference divides by it."""
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 256, generator=g).to(device)
    w1 = (torch.randn(256, 1024, generator=g) / 16).to(device).requires_grad_()
    w2 = (torch.randn(1024, 256, generator=g) / 32).to(device).requires_grad_()

    def step() -> None:
        w1.grad = w2.grad = None
        (torch.nn.functional.gelu(x @ w1) @ w2).square().mean().backward()

    return 1e3 * statistics.median(_timed(step, device) for _ in range(repeats + 1))


def _timed(step: Any, device: Any) -> float:
    """Seconds of one ``step()``, synchronised on CUDA."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t


def child(args: argparse.Namespace) -> None:
    """Build one side's model, time it, print one ``RESULT {json}`` line."""
    import torch

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    if args.side == "gridtnp":
        model, call = build_gridtnp(args.model)
    else:
        model, call = build_reference(args.model, args.reference)
    model = model.to(device)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    xc, yc, xt, yt = (t.to(device) for t in make_inputs(args.batch, args.nc, args.nt, args.seed))
    build_s = time.perf_counter() - t0
    bf16 = args.precision == "bf16"

    if args.kind == "fwd":
        model.eval()

        def step() -> float:
            with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                return float(call(xc, yc, xt).mean.float().sum())

    else:
        model.train()

        def step() -> float:
            model.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = -call(xc, yc, xt).log_prob(yt).float().mean()
            loss.backward()
            return float(loss)

    gc.collect()
    exact = _reset_peak()
    base_rss = _status_kib("VmRSS")
    base_maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base_cuda = torch.cuda.memory_allocated(device)
    first = []
    for _ in range(args.warmup):
        first.append(_timed(step, device))
    repeats = args.repeats
    if args.max_seconds and first and min(first) * repeats > args.max_seconds:
        repeats = max(3, int(args.max_seconds / min(first)))
    times = [_timed(step, device) for _ in range(repeats)]
    value = step()
    hwm = _status_kib("VmHWM")
    peak_kib = hwm - base_rss if exact and base_rss is not None and hwm is not None else None
    if device.type == "cuda":
        peak_kib, exact = (torch.cuda.max_memory_allocated(device) - base_cuda) / 1024, True
    out = {
        "side": args.side,
        "model": args.model,
        "kind": args.kind,
        "nc": args.nc,
        "nt": args.nt,
        "batch": args.batch,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "params": params,
        "median_ms": 1e3 * statistics.median(times),
        "min_ms": 1e3 * min(times),
        "times_ms": [round(1e3 * t, 2) for t in times],
        "warmup_ms": [round(1e3 * t, 2) for t in first],
        "peak_mb": None if peak_kib is None else peak_kib / 1024,
        "maxrss_growth_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_maxrss) / 1024,
        "peak_method": "CUDA max_memory_allocated growth"
        if device.type == "cuda"
        else ("VmHWM-VmRSS (clear_refs)" if exact else "ru_maxrss growth"),
        "build_s": build_s,
        "value": value,
        "device": args.device,
        "precision": args.precision,
        "calib_ms": calibration_ms(device),
    }
    print("RESULT " + json.dumps(out), flush=True)


# ------------------------------------------------------------------------------------------------ the parent
def run_child(args: argparse.Namespace, side: str, model: str, kind: str, nc: int) -> dict[str, Any]:
    """One measurement in a fresh process of ``side``'s Python; its result, or the error it ended with."""
    python = args.python if side == "gridtnp" else args.reference_python
    cmd = [
        python, str(Path(__file__).resolve()), "child", "--side", side, "--model", model, "--kind", kind,
        "--nc", str(nc), "--nt", str(args.nt), "--batch", str(args.batch), "--threads", str(args.threads),
        "--warmup", str(args.warmup), "--repeats", str(args.repeats), "--seed", str(args.seed),
        "--max-seconds", str(args.max_seconds), "--device", args.device, "--precision", args.precision,
    ]  # fmt: skip
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS=str(args.threads))
    env.pop("PYTHONPATH", None)
    if side == "gridtnp":
        env["PYTHONPATH"] = str(ROOT)
    else:
        cmd += ["--reference", str(args.reference)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.child_timeout, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    err = "out of memory (killed)" if proc.returncode in (-9, 137) else " | ".join(tail)
    for path, name in ((args.reference, "CHECKOUT"), (ROOT, ".")):  # no machine's paths in the results
        err = err.replace(str(Path(path).resolve()) if path else "\0", name)
    print(f"  ! {side} {model} {kind} nc={nc}: rc={proc.returncode}: {err}", file=sys.stderr, flush=True)
    return {"side": side, "model": model, "kind": kind, "nc": nc, "error": err}


def measure(args: argparse.Namespace, jobs: list[tuple[str, str, int, tuple[str, ...]]], log: Any) -> list[dict]:
    """``jobs``: (model, kind, nc, sides). Passes alternate the side order (reference first on even passes)."""
    results = []
    for p in range(args.passes):
        for model, kind, nc, sides in jobs:
            for side in sides if p % 2 == 0 else tuple(reversed(sides)):
                t = time.perf_counter()
                r = {**run_child(args, side, model, kind, nc), "pass": p}
                results.append(r)
                log(r)
                msg = f"error: {r['error']}" if "error" in r else f"{r['median_ms']:9.1f} ms"
                print(
                    f"  pass {p} {model:14s} {kind:6s} nc={nc:>9,d} {side:8s} {msg} ({time.perf_counter() - t:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    return results


def aggregate(results: list[dict]) -> dict[tuple, dict[str, Any]]:
    """(side, model, kind, nc) -> {median_ms, pass_medians_ms, peak_mb, params}, medians over the passes."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["side"], r["model"], r["kind"], r["nc"]), []).append(r)
    out: dict[tuple, dict[str, Any]] = {}
    for key, rs in groups.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            out[key] = {"error": rs[0]["error"]}
            continue
        out[key] = {
            "median_ms": statistics.median(r["median_ms"] for r in ok),
            "pass_medians_ms": [r["median_ms"] for r in ok],
            "peak_mb": statistics.median(
                r["peak_mb"] if r["peak_mb"] is not None else r["maxrss_growth_mb"] for r in ok
            ),
            "params": ok[0]["params"],
        }
    return out


def _ms(v: float | None) -> str:
    return "-" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:,.1f}")


def _int(v: int | None) -> str:
    return "-" if v is None else f"{v:,d}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def markdown(meta: dict[str, Any], results: list[dict]) -> str:
    """The result file's Markdown: metadata, the per-model table, the N_c scaling table, the alignment notes."""
    agg = aggregate(results)
    nc, nt, batch = meta["nc"], meta["nt"], meta["batch"]

    def get(side: str, model: str, kind: str, n: int, field: str) -> Any:
        e = agg.get((side, model, kind, n))
        return None if e is None or "error" in e else e[field]

    models = [m for m in meta["models"] if any(k[1] == m and k[3] == nc for k in agg)]
    lines = ["# gridtnp against the reference implementation, side by side", ""]
    for key in ("commit", "reference", "command", "hardware", "torch", "note"):
        if meta.get(key):
            lines.append(f"- {key}: {meta[key]}")
    cpu = meta.get("cpu")
    if cpu:
        lines.append(f"- CPU: {cpu['model']} ({cpu['vendor']}, {cpu['isa']}); {meta.get('load', '')}")
    device = meta.get("device", "cpu")
    precision = {"bf16": "bf16 autocast", "fp32": "float32"}[meta.get("precision", "fp32")]
    on = f"{meta['threads']} threads" if device == "cpu" else f"on {meta.get('hardware', device)}"
    lines += [
        f"- workload: N_c = {nc:,}, N_t = {nt:,}, batch {batch}, {precision}, {on}; time = median "
        f"over {meta['passes']} passes (a fresh process each, sides alternating first) of the median of "
        f"{meta['repeats']} calls after {meta['warmup']} warm-up; peak = "
        + ("growth of the peak resident set size" if device == "cpu" else "growth of CUDA's peak allocated memory"),
        "",
        "| model | params gridtnp | params ref | fwd ms gridtnp | fwd ms ref | fwd ratio | fwd+bwd ms gridtnp "
        "| fwd+bwd ms ref | fwd+bwd ratio | peak MB fwd gridtnp / ref | peak MB fwd+bwd gridtnp / ref |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def cells(model: str, n: int) -> list[str]:
        g = {k: get("gridtnp", model, k, n, "median_ms") for k in KINDS}
        r = {k: get("ref", model, k, n, "median_ms") for k in KINDS}
        gp = {k: get("gridtnp", model, k, n, "peak_mb") for k in KINDS}
        rp = {k: get("ref", model, k, n, "peak_mb") for k in KINDS}
        return [
            _ms(g["fwd"]), _ms(r["fwd"]), _ratio(g["fwd"], r["fwd"]),
            _ms(g["fwdbwd"]), _ms(r["fwdbwd"]), _ratio(g["fwdbwd"], r["fwdbwd"]),
            f"{_ms(gp['fwd'])} / {_ms(rp['fwd'])}", f"{_ms(gp['fwdbwd'])} / {_ms(rp['fwdbwd'])}",
        ]  # fmt: skip

    for m in models:
        pg = get("gridtnp", m, "fwd", nc, "params") or get("gridtnp", m, "fwdbwd", nc, "params")
        pr = get("ref", m, "fwd", nc, "params") or get("ref", m, "fwdbwd", nc, "params")
        lines.append("| " + " | ".join([MODELS[m]["label"], _int(pg), _int(pr), *cells(m, nc)]) + " |")
    scaling = sorted({k[3] for k in agg if k[1] == meta["scaling_model"]})
    if len(scaling) > 1:
        m = meta["scaling_model"]
        lines += [
            "",
            f"{MODELS[m]['label']} against N_c (N_t = {nt:,}, batch {batch}):",
            "",
            "| N_c | fwd ms gridtnp | fwd ms ref | fwd ratio | fwd+bwd ms gridtnp | fwd+bwd ms ref | fwd+bwd ratio "
            "| peak MB fwd gridtnp / ref | peak MB fwd+bwd gridtnp / ref |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        lines += ["| " + " | ".join([f"{n:,}", *cells(m, n)]) + " |" for n in scaling]
    per_pass = []
    for m in models:
        g, r = agg.get(("gridtnp", m, "fwdbwd", nc), {}), agg.get(("ref", m, "fwdbwd", nc), {})
        if "pass_medians_ms" in g and "pass_medians_ms" in r and len(g["pass_medians_ms"]) > 1:
            ratios = [a / b for a, b in zip(g["pass_medians_ms"], r["pass_medians_ms"], strict=False)]
            per_pass.append(f"- {MODELS[m]['label']}: " + ", ".join(f"{x:.2f}" for x in ratios))
    if per_pass:
        lines += ["", "Forward+backward ratio per pass (gridtnp / reference):", "", *per_pass]
    errors = [(k, e["error"]) for k, e in agg.items() if "error" in e]
    if errors:
        lines += ["", "Failed runs:", ""] + [f"- {' '.join(map(str, k))}: {e}" for k, e in errors]
    lines += ["", "Notes on alignment:", ""] + [f"- {MODELS[m]['label']}: {MODELS[m]['note']}" for m in models]
    return "\n".join(lines) + "\n"


def read_results(path: Path) -> tuple[dict[str, Any], list[dict]]:
    """The ``meta`` record and the child results of a JSON-lines result file."""
    meta: dict[str, Any] = {}
    results = []
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            if "meta" in record:
                meta = record["meta"]
            else:
                results.append(record)
    return meta, results


def reference_commit(reference: Path) -> str:
    """The reference checkout's short commit, or ``not recorded`` where it is not a git checkout of its own."""
    from harness import short_commit

    return short_commit(reference) or "not recorded (not a git checkout)"


def baseline_for(args: argparse.Namespace) -> Path:
    """``--baseline``, else the last recorded run (by name) on this device kind, precision and CPU or GPU model."""
    if args.baseline is not None:
        return args.baseline
    import torch
    from harness import cpu_info, device_name

    here = cpu_info()["model"] if args.device == "cpu" else device_name(torch.device(args.device))
    found = []
    for path in sorted((ROOT / "benchmarks" / "results").glob("perf_vs_ref_*.jsonl")):
        meta, _ = read_results(path)
        if (meta.get("device", "cpu"), meta.get("precision", "fp32")) != (args.device, args.precision):
            continue
        recorded = meta.get("cpu", {}).get("model", meta.get("hardware", "")) if args.device == "cpu" else ""
        if here in (recorded if args.device == "cpu" else meta.get("hardware", "")):
            found.append(path)
    if not found:
        raise SystemExit(
            f"--check: no recorded run on {here} ({args.device}, {args.precision}) under benchmarks/results/. Record "
            "one first (python benchmarks/perf_vs_ref.py --reference CHECKOUT --out benchmarks/results/"
            "perf_vs_ref_<device>.jsonl) or name one with --baseline FILE."
        )
    return found[-1]


def ratios(results: list[dict], models: list[str], nc: int, with_reference: bool) -> dict[str, float]:
    """Per model, the forward+backward time of gridtnp over the reference's (``with_reference``) or over the fixed
    calibration workload timed in the same child: medians over the passes."""
    out = {}
    agg = aggregate(results)
    for m in models:
        if with_reference:
            g, r = agg.get(("gridtnp", m, "fwdbwd", nc), {}), agg.get(("ref", m, "fwdbwd", nc), {})
            if "median_ms" in g and "median_ms" in r:
                out[m] = g["median_ms"] / r["median_ms"]
            continue
        own = [
            r["median_ms"] / r["calib_ms"]
            for r in results
            if (r["side"], r["model"], r["kind"], r["nc"]) == ("gridtnp", m, "fwdbwd", nc) and r.get("calib_ms")
        ]
        if own:
            out[m] = statistics.median(own)
    return out


def check(args: argparse.Namespace) -> None:
    """Rerun the recorded models' forward+backward and fail (exit 1) where a ratio grew past ``--band``."""
    sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]
    baseline = baseline_for(args)
    meta, recorded_results = read_results(baseline)
    with_reference = args.reference is not None
    if with_reference and not (args.reference / "experiments" / "configs").is_dir():
        raise SystemExit("--reference: give a checkout of smokeStacking/gridded-tnp (it has experiments/configs)")
    for key in ("nc", "nt", "batch", "threads"):  # the recorded workload
        setattr(args, key, meta[key])
    models = [m for m in (args.models or meta["models"]) if m in MODELS]
    recorded = ratios(recorded_results, models, meta["nc"], with_reference)
    if not recorded:
        what = "reference runs" if with_reference else "calibration times (calib_ms; record it again)"
        raise SystemExit(f"--check: {relative_path(baseline)} has no {what} for {models}.")
    models = [m for m in models if m in recorded]
    sides = ("ref", "gridtnp") if with_reference else ("gridtnp",)
    jobs = [(m, "fwdbwd", meta["nc"], sides) for m in models]
    now = ratios(measure(args, jobs, lambda record: None), models, meta["nc"], with_reference)
    against = "the reference" if with_reference else "the calibration workload"
    print(f"forward+backward time over {against}; recorded: {relative_path(baseline)} ({meta.get('commit')})")
    print(f"{'model':44s} {'recorded':>9s} {'now':>9s} {'change':>8s}")
    failed = []
    for m in models:
        if m not in now:
            failed.append(m)
            print(f"{MODELS[m]['label']:44s} {recorded[m]:9.3f} {'failed':>9s}")
            continue
        change = now[m] / recorded[m] - 1
        if change > args.band:
            failed.append(m)
        print(f"{MODELS[m]['label']:44s} {recorded[m]:9.3f} {now[m]:9.3f} {change:+8.0%}")
    if failed:
        raise SystemExit(f"slower than recorded by more than {args.band:.0%} (or failed): {', '.join(failed)}")
    print(f"every ratio within {args.band:.0%} of the recorded run")


def relative_path(path: Path) -> str:
    """``path`` relative to the repository where it lies inside it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return path.name


def parent(args: argparse.Namespace) -> None:
    """Measure every (model, kind, N_c, side) over the passes, write the JSON lines and the Markdown."""
    out = args.out
    if args.tables_only:
        meta, results = read_results(out)
        out.with_suffix(".md").write_text(markdown(meta, results))
        print(out.with_suffix(".md").read_text())
        return
    sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]  # this checkout's gridtnp, as the gridtnp children use
    import torch
    from harness import command_line, cpu_info, device_name, git_commit

    models = args.models or DEFAULT_MODELS
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    if args.reference is None or not (args.reference / "experiments" / "configs").is_dir():
        raise SystemExit("--reference: give a checkout of smokeStacking/gridded-tnp (it has experiments/configs)")
    torch.set_num_threads(args.threads)
    sides = ("ref", "gridtnp")
    jobs = [(m, k, args.nc, sides) for m in models for k in args.kinds]
    scaling_nc = [n for n in args.scaling_nc if n != args.nc or args.scaling_model not in models]
    jobs += [(args.scaling_model, k, n, sides) for n in scaling_nc for k in args.kinds]
    jobs += [(args.scaling_model, "fwd", n, ("gridtnp",)) for n in args.gridtnp_only_nc]
    meta = {
        "commit": git_commit(),
        "reference": f"smokeStacking/gridded-tnp {reference_commit(args.reference)}",
        "command": command_line([sys.argv[0], *["CHECKOUT" if a == str(args.reference) else a for a in sys.argv[1:]]]),
        "hardware": device_name(torch.device(args.device)),
        "cpu": cpu_info(),
        "load": f"1-min load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start",
        "device": args.device,
        "precision": args.precision,
        "torch": torch.__version__,
        "models": models,
        "scaling_model": args.scaling_model,
        **{k: getattr(args, k) for k in ("nc", "nt", "batch", "threads", "passes", "repeats", "warmup")},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta}) + "\n")

    def log(record: dict) -> None:
        with out.open("a") as f:
            f.write(json.dumps(record) + "\n")

    print(f"{sum(len(j[3]) for j in jobs) * args.passes} child runs", file=sys.stderr)
    results = measure(args, jobs, log)
    out.with_suffix(".md").write_text(markdown(meta, results))
    print(out.with_suffix(".md").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", nargs="?", default="run", choices=["run", "child"], help="child: one measurement")
    p.add_argument("--reference", type=Path, help="a checkout of smokeStacking/gridded-tnp (required to measure)")
    p.add_argument("--reference-python", default=sys.executable, help="Python with the reference's dependencies")
    p.add_argument("--python", default=sys.executable, help="Python for gridtnp's side (this checkout is used)")
    p.add_argument("--models", nargs="*", help=f"default: {' '.join(DEFAULT_MODELS)}; all: {' '.join(MODELS)}")
    p.add_argument("--kinds", nargs="*", default=list(KINDS), choices=KINDS)
    p.add_argument("--nc", type=int, default=10_000)
    p.add_argument("--nt", type=int, default=1_000)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--max-seconds", type=float, default=60.0, help="fewer repeats (at least 3) past this per child")
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scaling-model", default="swin_pt_32", choices=list(MODELS))
    p.add_argument("--scaling-nc", type=int, nargs="*", default=[1_000, 10_000, 100_000])
    p.add_argument("--gridtnp-only-nc", type=int, nargs="*", default=[1_000_000], help="forward only, gridtnp only")
    p.add_argument("--child-timeout", type=float, default=900)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON lines; the Markdown gets the same stem")
    p.add_argument("--tables-only", action="store_true", help="re-render the Markdown from --out, measure nothing")
    p.add_argument("--device", default="cpu", help="cpu or cuda (the models and inputs on it)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="bf16: autocast on the device")
    p.add_argument(
        "--check",
        action="store_true",
        help="rerun the recorded run's models (fwd+bwd) and exit 1 where a ratio grew by more than --band; without "
        "--reference the ratio is to a fixed calibration workload timed in the same process",
    )
    p.add_argument("--baseline", type=Path, help="--check: the recorded JSON lines (default: this CPU's or GPU's)")
    p.add_argument("--band", type=float, default=0.25, help="--check: allowed growth of a ratio (default 0.25)")
    p.add_argument("--side", choices=["gridtnp", "ref"], help="child: which side")
    p.add_argument("--model", default="swin_pt_32", choices=list(MODELS), help="child: which model")
    p.add_argument("--kind", choices=KINDS, default="fwd", help="child: which pass")
    args = p.parse_args()
    if args.command == "child":
        child(args)
    elif args.check:
        check(args)
    else:
        parent(args)


if __name__ == "__main__":
    main()
