"""Forward and forward + backward time of grid processors at equal width: ``hypermixer``, ``transformer``, ``swin``.

    python benchmarks/processor_speed.py --threads 2 --batch-size 2             # grids 16^2, 32^2, 64^2
    python benchmarks/processor_speed.py --device cuda --batch-size 8

The processor alone on random grid tokens ``[B, M, M, D]``: D = 128, 5 layers, each processor at the widths of the
gridded TNP paper's Swin-TNP (8 heads of 16, MLPs 128 wide; HyperMixer: 128 mixing units, hypernetworks 128 wide;
Swin: windows of 4 x 4 shifted by 2). ``forward``: no gradients, eval mode; ``forward+backward``: the sum of the
last state, backward. Full attention (``transformer``) costs O(M^4) in the grid side M, Swin and HyperMixer O(M^2).
"""

from __future__ import annotations

import argparse

import harness
import torch

from gridtnp import count_parameters
from gridtnp.nn.grids import Grid
from gridtnp.nn.tokens import Latent
from gridtnp.registry import build_from_spec

DIM = 128
SPECS = {
    "hypermixer": {"name": "hypermixer", "layers": 5, "mixing_dim": 128, "hyper_hidden": 128, "mlp_dim": 128},
    "transformer": {"name": "transformer", "layers": 5, "heads": 8, "head_dim": 16, "mlp_dim": 128},
    "swin": {"name": "swin", "layers": 5, "window": 4, "shift": 2, "heads": 8, "head_dim": 16, "mlp_dim": 128},
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--grid-sizes", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--processors", nargs="+", default=list(SPECS), choices=list(SPECS))
    harness.add_common_arguments(parser, "processor_speed")
    args = parser.parse_args(argv)
    harness.finish_common_arguments(parser, args, "processor_speed", repeats=(3, 5))
    device = torch.device(args.device)
    meta = harness.metadata(args, device, inputs=f"grid tokens [{args.batch_size}, M, M, {DIM}], standard normal")
    rows = []
    for m in args.grid_sizes:
        grid = Grid([-6.0, -6.0], [6.0, 6.0], [m, m])
        tokens = torch.randn(args.batch_size, m, m, DIM, device=device)
        for name in args.processors:
            proc = build_from_spec("processor", SPECS[name], dim=DIM, grid=grid).to(device)
            proc = harness.maybe_compile(proc, args.compile)

            latent = Latent(tokens, grid=grid)

            def forward(proc: torch.nn.Module = proc, latent: Latent = latent) -> None:
                with torch.no_grad(), harness.autocast(device, args.bf16):
                    proc.eval()(latent)

            def backward(proc: torch.nn.Module = proc, latent: Latent = latent) -> None:
                with harness.autocast(device, args.bf16):
                    states = proc.train()(latent)
                states[-1].tokens.float().sum().backward()

            for label, fn in (("forward", forward), ("forward+backward", backward)):
                try:
                    times, memory, note = harness.measure(fn, device, args.warmup, args.repeats, args.max_call_seconds)
                    median = harness.fmt(sorted(times)[len(times) // 2])
                except RuntimeError as err:
                    if not harness.is_out_of_memory(err):
                        raise
                    median, memory, note = "OOM", None, "out of memory"
                rows.append(
                    {
                        "grid": f"{m} x {m}",
                        "tokens": m * m,
                        "processor": name,
                        "parameters": count_parameters(proc),
                        "pass": label,
                        "median ms": median,
                        "peak memory MiB": harness.fmt(memory),
                        "note": note,
                    }
                )
                print(rows[-1], flush=True)
            harness.free(device)
    title = "Grid processors at equal width: HyperMixer, full MHSA, Swin"
    for path in harness.write_table(args.out, title, meta, rows):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
