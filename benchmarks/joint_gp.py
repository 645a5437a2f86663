"""Joint predictives on the 2-D GP task: energy score of an independent and a joint model against the exact GP.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/joint_gp.py --minutes 6 --layers 2 --lr 1e-3 \
        --out benchmarks/results/joint_gp_cpu.md
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/joint_gp.py --model convcnp --separable --layers 4 \
        --minutes 10 --lr 1e-3 --lr-schedule cosine --clip 0 --mean-gradients marginals marginal \
        --out benchmarks/results/joint_gp_convcnp_cpu.md
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/joint_gp.py --model convcnp --separable --layers 4 \
        --steps 5000 --lr 1e-3 --lr-schedule cosine --clip 0 --mean-gradients marginals \
        --out benchmarks/results/joint_gp_convcnp_steps_cpu.md

Models of one architecture and size are trained for the same wall time (``--minutes``) or the same number of steps
(``--steps``) on the ``gp2d`` task (SE kernel, known length-scale and noise; x ~ U[domain]^2, a random number of
context points, fixed targets): one with the independent ``gaussian`` likelihood, and one with the joint
``lowrank_gaussian`` for each ``--mean-gradients`` (what fits the mean: the joint density, the marginal ones, or
with ``marginals`` the marginal densities fit the mean and the marginal scales and the joint density the
correlations). ``--model tnp`` is a TNP (MLP encoder, transformer over the context, cross-attention into the
targets); ``--model convcnp`` a ConvCNP-like gridded model (SetConv onto a square grid, a residual CNN, SetConv
back to the targets, the likelihood's MLP head on the result). On a fixed test set (the same tasks for every model)
they are scored with ``gridtnp.joint_metrics.JointScores`` (energy score, variogram score of order 0.5, joint
log-likelihood per target, coverage of the regional mean's 90 % interval), beside the exact GP's joint predictive
of the noisy targets under the task's own covariance (``SKIGrid.covariance``, the SKI kernel that drew the data),
written as a ``LowRankNormal`` of full rank so that every predictive is scored by the same code and samples' seed;
``--exact-marginals`` adds the exact GP's marginals as an independent predictive (the correlations' share of a score).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.distributions import Normal

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import command_line, device_name, git_commit, write_table

from gridtnp.batch import Batch
from gridtnp.data.datamodules import FixedTaskSet, SyntheticDataModule
from gridtnp.data.sections import from_flat_arguments
from gridtnp.joint_metrics import JointScores
from gridtnp.metrics import gaussian_crps
from gridtnp.module import NeuralProcessModule
from gridtnp.nn.lowrank_normal import LowRankNormal
from gridtnp.registry import build_from_spec


def task_spec(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "name": "gp2d",
        "lengthscale": args.lengthscale,
        "noise": args.noise,
        "num_context": args.max_context,
        "min_context": args.min_context,
        "num_targets": args.targets,
        "domain": [-args.half_width, args.half_width],
    }


def model_args(likelihood: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    if args.model == "tnp":
        slots = {
            "encoder": {"name": "mlp"},
            "grid_encoder": {"name": "identity"},
            "processor": {"name": "transformer", "layers": args.layers},
            "grid_decoder": {"name": "cross_attention"},
        }
    else:  # convcnp: SetConv onto a grid, a residual CNN on it, SetConv back to the targets
        bound = args.grid_bound
        slots = {
            "grid": {"lower": [-bound, -bound], "upper": [bound, bound], "shape": [args.grid_size] * 2},
            "encoder": {"name": "identity"},
            "grid_encoder": {"name": "kernel_interpolation"},
            "processor": {"name": "cnn", "channels": args.dim, "layers": args.layers, "separable": args.separable},
            "grid_decoder": {"name": "kernel_interpolation"},
        }
    return {
        "dim_x": 2,
        "dim_y": 1,
        "dim": args.dim,
        **slots,
        "likelihood": likelihood,
        "lr": args.lr,
        "lr_schedule": args.lr_schedule,
    }


@torch.no_grad()
def exact_posterior(task: Any, batch: Batch) -> LowRankNormal:
    """The exact GP predictive ``[B, Nt, 1]`` of the noisy targets given the noisy context, as a full-rank
    ``LowRankNormal`` (factor: the Cholesky factor of the latent posterior covariance; diagonal: the noise)."""
    context = batch.context["points"]
    xc, xt, mc = context.x.double(), batch.target.x.double(), context.mask.double()
    nc, noise = xc.shape[1], task.noise**2
    cov = task.grid.covariance(torch.cat([xc, xt], 1), torch.cat([xc, xt], 1))
    k_cc = cov[:, :nc, :nc] * mc[:, :, None] * mc[:, None, :] + torch.diag_embed(noise * mc + (1 - mc))
    k_tc, k_tt = cov[:, nc:, :nc] * mc[:, None, :], cov[:, nc:, nc:]
    chol = torch.linalg.cholesky(k_cc)
    v = torch.linalg.solve_triangular(chol, k_tc.transpose(-1, -2), upper=False)  # [B, C, T]
    alpha = torch.linalg.solve_triangular(chol, (context.y[..., 0].double() * mc)[..., None], upper=False)
    mean = (v * alpha).sum(-2)  # [B, T]
    latent = k_tt - v.transpose(-1, -2) @ v
    eye = torch.eye(latent.shape[-1], dtype=latent.dtype)
    factor = torch.linalg.cholesky(0.5 * (latent + latent.transpose(-1, -2)) + 1e-8 * eye)  # [B, T, T]
    return LowRankNormal(
        mean[..., None].float(), factor[:, :, None, :].float(), torch.full_like(mean, noise)[..., None].float()
    )


@torch.no_grad()
def scores(predictives: dict[str, Any], test: FixedTaskSet, samples: int) -> dict[str, dict[str, float]]:
    """Mean over the test tasks of every joint score and the marginal CRPS, per predictive (a function of a batch)."""
    scorer = JointScores(samples)
    totals: dict[str, dict[str, list[torch.Tensor]]] = {name: {} for name in predictives}
    for batch in test:
        weight = batch.target.valid().float()
        for name, predictive in predictives.items():
            dist = predictive(batch)
            values = scorer.scores(dist, batch.target.y, weight)
            values["crps"] = gaussian_crps(dist.mean, dist.stddev, batch.target.y.float()).mean((1, 2))
            for key, value in values.items():
                totals[name].setdefault(key, []).append(value)
    return {n: {k: float(torch.cat(v).mean()) for k, v in t.items()} for n, t in totals.items()}


def train(likelihood: dict[str, Any], args: argparse.Namespace) -> tuple[NeuralProcessModule, int, float]:
    L.seed_everything(args.seed, verbose=False)
    data = from_flat_arguments(
        SyntheticDataModule, task=task_spec(args), batch_size=args.batch_size, train_batches=1000, val_batches=1,
        seed=args.seed,
    )  # fmt: skip
    module = NeuralProcessModule(**model_args(likelihood, args))
    trainer = L.Trainer(
        accelerator="cpu", max_time=None if args.steps else {"seconds": int(args.minutes * 60)},
        max_steps=args.steps or -1, max_epochs=-1,
        limit_val_batches=0, gradient_clip_val=args.clip or None, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    start = time.perf_counter()
    trainer.fit(module, data)
    module.eval()
    return module, trainer.global_step, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=4.0, help="training wall time per model")
    parser.add_argument("--steps", type=int, default=0, help="train every model this many steps instead of --minutes")
    parser.add_argument("--rank", type=int, default=16, help="rank of the joint likelihood's covariance factor")
    parser.add_argument(
        "--mean-gradients", nargs="+", default=["marginal", "joint"], choices=["marginal", "marginals", "joint"]
    )
    parser.add_argument("--model", default="tnp", choices=["tnp", "convcnp"], help="the architecture of every model")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--grid-size", type=int, default=20, help="convcnp: grid points per dimension")
    parser.add_argument("--grid-bound", type=float, default=3.0, help="convcnp: the grid spans [-b, b]^2")
    parser.add_argument("--separable", action="store_true", help="convcnp: depthwise-separable convolutions")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument(
        "--lr-schedule", default="constant", choices=["constant", "cosine"], help="cosine: over --minutes"
    )
    parser.add_argument("--clip", type=float, default=0.5, help="gradient norm clipping; 0 for none")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lengthscale", type=float, default=1.0)
    parser.add_argument("--noise", type=float, default=0.1)
    parser.add_argument("--half-width", type=float, default=2.0, help="x ~ U[-w, w]^2")
    parser.add_argument("--min-context", type=int, default=5)
    parser.add_argument("--max-context", type=int, default=60)
    parser.add_argument("--targets", type=int, default=64)
    parser.add_argument("--test-batches", type=int, default=16)
    parser.add_argument("--samples", type=int, default=64, help="samples per task of the sample-based scores")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--exact-marginals",
        action="store_true",
        help="also score the exact GP's marginals as an independent predictive",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/joint_gp_cpu.md"))
    args = parser.parse_args()
    commit, load = git_commit(), os.getloadavg()[0]
    task = build_from_spec("task", task_spec(args))
    test = FixedTaskSet(task, args.batch_size, args.test_batches, seed=args.seed, split="test")
    predictives: dict[str, Any] = {"exact GP": lambda batch: exact_posterior(task, batch)}
    if args.exact_marginals:  # the exact marginals without their correlations
        predictives["exact GP marginals"] = lambda batch: (lambda d: Normal(d.mean, d.stddev))(
            exact_posterior(task, batch)
        )
    trained: dict[str, tuple[int, int, float]] = {}
    variants = [("gaussian", {"name": "gaussian"})]
    for how in args.mean_gradients:
        spec = {"name": "lowrank_gaussian", "rank": args.rank, "mean_gradient": how}
        variants.append((f"lowrank_gaussian rank {args.rank}, mean_gradient {how}", spec))
    for label, likelihood in variants:
        module, steps, seconds = train(likelihood, args)
        predictives[label] = lambda batch, module=module: module(batch)
        trained[label] = (module.num_parameters, steps, seconds)
        print(f"{label}: {steps} steps in {seconds:.0f} s", flush=True)
    results = scores(predictives, test, args.samples)
    exact = results["exact GP"]["energy_score"]
    rows = []
    for label, values in results.items():
        parameters, steps, seconds = trained.get(label, (0, 0, 0.0))
        rows.append(
            {
                "predictive": label,
                "parameters": parameters,
                "steps": steps,
                "train_seconds": round(seconds),
                "energy_score": round(values["energy_score"], 4),
                "energy_score / exact": round(values["energy_score"] / exact, 3),
                "variogram_score": round(values["variogram_score"], 4),
                "joint_loglik": round(values["joint_loglik"], 3),
                "crps": round(values["crps"], 4),
                "regional_mean_coverage_90": round(values["regional_mean_coverage_90"], 3),
            }
        )
        print(rows[-1], flush=True)
    meta = {
        "command": f"`{command_line()}`",
        "device": device_name(torch.device("cpu")),
        "torch": torch.__version__,
        "commit": commit,
        "load": f"{load:.2f} at the start"
        + ("" if args.steps else " (steps per model depend on it: every model gets the same wall time)"),
        "task": f"{task_spec(args)}",
        "test set": f"{args.test_batches} batches of {args.batch_size} tasks, seed {args.seed}; {args.samples} "
        "samples per task for the energy and variogram scores (the same seed for every predictive)",
        "bar": "joint energy score within 10 % of the exact GP's and below the independent model's",
    }
    for path in write_table(args.out, "Joint predictives on the 2-D GP task", meta, rows):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
