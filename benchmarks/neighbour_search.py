"""Time of the cell-list k-nearest-neighbour search (``gridtnp.nn.neighbours.knn_points``) against N_c.

    python benchmarks/neighbour_search.py --threads 2                  # N_c = 1e4, 1e5, 1e6
    python benchmarks/neighbour_search.py --device cuda

Context points uniform in [-6, 6]^2 (the 2-D GP task's box), ``--num-targets`` targets in the same box, batch 1,
``--k`` nearest. For comparison, the brute-force search (``torch.cdist`` then ``topk``, an N_t x N_c distance matrix)
where it fits in ``--brute-force-max-pairs`` pairs. The cell-list search should grow about linearly in N_c (a sort
of the N_c cell keys, then a fixed amount of work per target); brute force grows with N_c N_t.
"""

from __future__ import annotations

import argparse

import harness
import torch

from gridtnp.nn.neighbours import knn_points


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--num-context", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--num-targets", type=int, default=10_000)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--dim-x", type=int, default=2)
    parser.add_argument("--brute-force-max-pairs", type=float, default=2e8)
    harness.add_common_arguments(parser, "neighbour_search")
    args = parser.parse_args(argv)
    harness.finish_common_arguments(parser, args, "neighbour_search", repeats=(3, 5))
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    xt = (torch.rand(1, args.num_targets, args.dim_x, generator=gen) * 12 - 6).to(device)
    meta = harness.metadata(args, device, inputs=f"batch 1, x uniform in [-6, 6]^{args.dim_x}, float32")
    rows = []
    first = None
    for nc in args.num_context:
        xc = (torch.rand(1, nc, args.dim_x, generator=gen) * 12 - 6).to(device)
        mask = torch.ones(1, nc, dtype=torch.bool, device=device)
        times, memory, note = harness.measure(
            lambda xc=xc, mask=mask: knn_points(xc, mask, xt, args.k),
            device,
            args.warmup,
            args.repeats,
            args.max_call_seconds,
        )
        median = sorted(times)[len(times) // 2]
        first = first or (nc, median)
        brute = "-"
        if nc * args.num_targets <= args.brute_force_max_pairs:
            bt, _, _ = harness.measure(
                lambda xc=xc: torch.cdist(xt, xc).topk(args.k, largest=False),
                device,
                args.warmup,
                args.repeats,
                args.max_call_seconds,
            )
            brute = harness.fmt(sorted(bt)[len(bt) // 2])
        rows.append(
            {
                "N_c": nc,
                "N_t": args.num_targets,
                "k": args.k,
                "cell lists, median ms": harness.fmt(median),
                "ms per 1e4 context points": harness.fmt(median / nc * 1e4, 2),
                "x first N_c (time)": harness.fmt(median / first[1], 2),
                "x first N_c (size)": harness.fmt(nc / first[0], 0),
                "brute force (cdist + topk), median ms": brute,
                "peak memory MiB": harness.fmt(memory),
                "note": note,
            }
        )
        print(rows[-1], flush=True)
    for path in harness.write_table(args.out, "k-nearest-neighbour search by cell lists against N_c", meta, rows):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
