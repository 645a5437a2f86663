"""Regenerate the tables of ``docs/results.md``, ``docs/performance.md`` and ``docs/joint.md`` from the result
files under ``benchmarks/results/``.

Every table in those pages sits between ``<!-- table: NAME -->`` and ``<!-- end table -->``; ``NAME`` is a key of
``TABLES``, whose function reads the result files and returns the Markdown. The text around the markers is left as
it is.

    python benchmarks/render_results.py            # rewrite the tables in place
    python benchmarks/render_results.py --check    # exit 1 (and name the tables) if the page is stale
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = tuple(ROOT / "docs" / page for page in ("results.md", "performance.md", "joint.md"))  # pages with marked tables
MARKER = re.compile(r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end table -->)", re.DOTALL)


# ------------------------------------------------------------------------------------------------------ utilities
def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table; ``None`` cells are empty."""
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join("" if c is None else str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def read_csv(name: str) -> list[dict[str, str]]:
    with (RESULTS / name).open(newline="") as f:
        return list(csv.DictReader(f))


def read_jsonl(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (RESULTS / name).read_text().splitlines() if line.strip()]


def read_json(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / name).read_text())


def num(value: Any, digits: int = 0) -> str:
    """A number with thousands separators and ``digits`` decimals; blanks and dashes as they are."""
    if value in (None, "", "-"):
        return "" if value is None else str(value)
    return f"{float(str(value).replace(',', '')):,.{digits}f}"


def millions(value: Any) -> str:
    n = int(value)
    return f"{n / 1e6:.2f} M" if n >= 10_000 else str(n)


def fixed(value: Any, digits: int = 3) -> str:
    return "" if value is None else (value if isinstance(value, str) else f"{value:.{digits}f}")


# ------------------------------------------------------------------------------------------------- GP tasks
def gp1d_tnp() -> str:
    rows = read_json("gp1d_tnp_cpu.json")["rows"]
    header = ["", "validation log-likelihood", "validation RMSE", "test log-likelihood", "test RMSE"]
    keys = ("val_loglik", "val_rmse", "test_loglik", "test_rmse")
    return table(header, [[r["row"], *(fixed(r[k]) for k in keys)] for r in rows])


def budget_rows(rows: list[dict[str, str]], labels: dict[str, str]) -> list[list[str]]:
    return [
        [
            f"{labels.get(r['recipe'], r['recipe'])} (`{r['recipe']}`)",
            millions(r["parameters"]),
            num(r["steps"]),
            f"{float(r['test_loglik']):.3f}",
            f"{float(r['test_rmse']):.3f}",
        ]
        for r in rows
    ]


def budget_header(minutes: int) -> list[str]:
    return ["model (recipe)", "parameters", f"steps in {minutes} min", "test log-likelihood", "test RMSE"]


#: Table 3's rows at l = 0.5 (label, paper log-likelihood) for the recipes of ``recipes/paper/``.
TABLE3_ROWS = {
    "table3_cnp": ("CNP", "-0.406"),
    "table3_pt_tnp_m128": ("PT-TNP, M = 128", "0.819"),
    "table3_convcnp_32x32": ("ConvCNP, five-layer CNN, 32 x 32", "0.801"),
    "table3_vit_pt_32x32_to_16x16": ("ViTNP, PT-GE 32 x 32 -> 16 x 16", "0.841"),
    "table3_swin_pt_32x32": ("Swin-TNP, PT-GE 32 x 32", "0.844"),
    "table3_swin_ki_32x32": ("Swin-TNP, KI-GE 32 x 32", "0.844"),
}


def gp2d_table3_budget() -> str:
    rows = read_csv("gp2d_table3_budget_cpu.csv")
    if (RESULTS / "gp2d_table3_budget_cpu_vit.csv").exists():  # a row run again alone replaces the first run's
        again = {r["recipe"]: r for r in read_csv("gp2d_table3_budget_cpu_vit.csv")}
        rows = [again.get(r["recipe"], r) for r in rows]
    labels = {name: label for name, (label, _) in TABLE3_ROWS.items()}
    body = [[*row, TABLE3_ROWS[r["recipe"]][1]] for row, r in zip(budget_rows(rows, labels), rows, strict=True)]
    return table([*budget_header(20), "paper, Table 3 log-likelihood"], body)


def gp2d_budget() -> str:
    labels = {
        "gp2d_swin_pt": "Swin-TNP, PT-GE, raw coordinates",
        "gp2d_hypermixer": "HyperMixer in place of Swin",
        "gp2d_vit_pt_patch": "ViTNP, full MHSA over 2 x 2 patches",
        "gp2d_gka_knn": "Gaussian kernel averaging over the 32 nearest, learned scales",
        "gp2d_interp": "learned interpolation: IDW over the 4 nearest, affine map, constant variance",
    }
    rows = [r for name in labels for r in read_csv(f"gp2d_budget_cpu/{name}.csv")]
    return table(budget_header(3), budget_rows(rows, labels))


def joint_gp(name: str = "joint_gp_cpu.csv", minutes: int | None = 6) -> str:
    """The joint_gp.py table: steps in a wall time of ``minutes``, or (None) the steps and their seconds."""
    rows = read_csv(name)
    header = ["predictive", f"steps in {minutes} min" if minutes else "steps (seconds)", "energy score",
              "/ exact GP", "variogram score", "joint log-lik", "CRPS", "regional mean 90 % coverage"]  # fmt: skip
    keys = ("energy_score", "energy_score / exact", "variogram_score", "joint_loglik", "crps")

    def steps(r: dict[str, str]) -> str:
        return "" if not int(r["steps"]) else num(r["steps"]) + ("" if minutes else f" ({r['train_seconds']})")

    body = [
        [r["predictive"], steps(r), *(r[k] for k in keys),
         r["regional_mean_coverage_90"]]
        for r in rows
    ]  # fmt: skip
    return table(header, body)


def era5_joint() -> str:
    runs = read_json("era5_swin_joint_cpu.json")["runs"]
    header = ["recipe (likelihood)", "regional mean 90 % coverage", "energy score", "variogram score",
              "joint log-lik", "held-out RMSE (K)", "90 % coverage per station"]  # fmt: skip
    keys = ("regional_mean_coverage_90", "energy_score", "variogram_score", "joint_loglik")
    body = [
        [f"`{r['recipe']}` ({r['likelihood']})", *(fixed(r["metrics"][k]) for k in keys),
         fixed(r["metrics"]["heldout/rmse_physical"]), fixed(r["metrics"]["coverage_90"])]
        for r in runs
    ]  # fmt: skip
    return table(header, body)


def shifted_rows(name: str, sets: Sequence[str]) -> str:
    rows = read_csv(name)
    models = list(dict.fromkeys(r["model"] for r in rows))
    by = {(r["model"], r["test set"]): r for r in rows}
    out = []
    for m in models:
        first = by[(m, sets[0])]
        out.append([f"`{m}`", millions(first["parameters"]), *(f"{float(by[(m, s)]['loglik']):.3f}" for s in sets)])
    out.append(["exact GP (oracle)", "", *(f"{float(by[(models[0], s)]['oracle_loglik']):.3f}" for s in sets)])
    return table(["model (recipe)", "parameters", *sets], out)


def shifted_gp1d_paper() -> str:
    return shifted_rows("shifted_gp1d_paper_cpu.csv", ["Delta = 0", "Delta = 1"])


# ---------------------------------------------------------------------------------------------------- ERA5
def era5_demo() -> str:
    run = read_json("era5_demo_cpu.json")["runs"][0]
    rows = [
        [f"`{k}`", *(fixed(v, 2 if k.startswith(("coverage", "mean_z2")) else 3) for v in vs)]
        for k, vs in run["metrics"].items()
    ]
    return table(["metric", *run["columns"]], rows)


def era5_skill_table() -> str:
    """Models (the classical baselines beside them) per layout, from ``benchmarks/era5_skill.py --recipe ...``."""
    rows = read_csv("era5_skill_cpu.csv")
    header = list(rows[0])[: list(rows[0]).index("all RMSE (K)") + 1]  # the run's record follows

    def cell(key: str, value: str) -> str:
        if key != "model":
            return value
        name, _, note = value.partition(" (")  # "era5_mos (refitted)"
        return f"`{name}`" + (f" ({note}" if note else "")

    return table(header, [[cell(k, r[k]) for k in header] for r in rows])


def era5_residual_kriging() -> str:
    rows = read_json("era5_residual_kriging_cpu.json")["rows"]
    header = ["correlation of the residuals", "chosen on the validation days"]
    header += ["validation held-out RMSE (K)", "test held-out RMSE (K)"]
    return table(header, [[r["correlation"], r["chosen"], fixed(r["val"]), fixed(r["test"])] for r in rows])


# --------------------------------------------------------------------------------------------------- speed
def _perf() -> tuple[dict[str, Any], dict[tuple, dict[str, Any]], Any]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import perf_vs_ref

    meta, results = perf_vs_ref.read_results(RESULTS / "perf_vs_ref_cpu.jsonl")
    return meta, perf_vs_ref.aggregate(results), perf_vs_ref


def perf_vs_ref() -> str:
    meta, agg, module = _perf()
    nc, out = meta["nc"], []
    for m in meta["models"]:
        g = {k: agg[("gridtnp", m, k, nc)]["median_ms"] for k in ("fwd", "fwdbwd")}
        r = {k: agg[("ref", m, k, nc)]["median_ms"] for k in ("fwd", "fwdbwd")}
        out.append(
            [
                module.MODELS[m]["label"],
                f"{g['fwd'] / r['fwd']:.2f}",
                f"{g['fwdbwd'] / r['fwdbwd']:.3f}",
                f"{g['fwdbwd']:,.0f} / {r['fwdbwd']:,.0f}",
            ]
        )
    header = ["model", "gridtnp / reference, fwd", "fwd+bwd", "fwd+bwd ms, gridtnp / reference"]
    return table(header, out)


#: The side-by-side runs per device: (column, result file).
PERF_DEVICES = (
    ("AMD EPYC CPU", "perf_vs_ref_cpu.jsonl"),
    ("Intel Xeon CPU", "perf_vs_ref_cpu_intel.jsonl"),
    ("H200, float32", "perf_vs_ref_cuda_h200_fp32.jsonl"),
    ("H200, bf16", "perf_vs_ref_cuda_h200_bf16.jsonl"),
)


def perf_vs_ref_devices() -> str:
    """Forward+backward time of gridtnp over the reference's, per model and device (``-``: not measured there)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import perf_vs_ref as module

    ratios, commits, models = {}, [], []
    for column, name in PERF_DEVICES:
        meta, results = module.read_results(RESULTS / name)
        agg, nc = module.aggregate(results), meta["nc"]
        commits.append(f"{column}: {meta['commit']}")
        for m in meta["models"]:
            g, r = agg.get(("gridtnp", m, "fwdbwd", nc), {}), agg.get(("ref", m, "fwdbwd", nc), {})
            if "median_ms" in g and "median_ms" in r:
                ratios[(m, column)] = g["median_ms"] / r["median_ms"]
                models += [m] if m not in models else []
    rows = [
        [module.MODELS[m]["label"], *(f"{ratios[(m, c)]:.2f}" if (m, c) in ratios else "-" for c, _ in PERF_DEVICES)]
        for m in models
    ]
    return table(["model", *(c for c, _ in PERF_DEVICES)], rows) + "\ngridtnp commits: " + "; ".join(commits) + ".\n"


def perf_vs_ref_scaling() -> str:
    meta, agg, _ = _perf()
    m = meta["scaling_model"]
    ncs = sorted({k[3] for k in agg if k[1] == m})

    def get(side: str, kind: str, n: int) -> float | None:
        e = agg.get((side, m, kind, n))
        return None if e is None or "error" in e else e["median_ms"]

    out = []
    for n in ncs:
        gf, rf, gb, rb = (
            get("gridtnp", "fwd", n),
            get("ref", "fwd", n),
            get("gridtnp", "fwdbwd", n),
            get("ref", "fwdbwd", n),
        )
        out.append(
            [
                f"{n:,}",
                num(gf),
                num(rf) if rf else "-",
                f"{gb / rb:.2f}" if gb and rb else "-",
            ]
        )
    return table(["N_c", "fwd ms gridtnp", "fwd ms reference", "fwd+bwd ratio"], out)


def te_memory() -> str:
    rows = read_csv("te_memory_cpu.csv")
    by = {(r["version"], r["passes"], int(r["num_context"]), int(r["num_targets"])): r for r in rows}
    shapes = list(dict.fromkeys((int(r["num_context"]), int(r["num_targets"])) for r in rows))
    shapes.sort(key=lambda s: (s[1], s[0]))

    def mib(version: str, passes: str, shape: tuple[int, int]) -> str:
        r = by[(version, passes, *shape)]
        if r["peak_mib"]:
            return num(r["peak_mib"])
        estimate = re.search(r"estimated (\S+ GB)", r["note"])
        return f"not run (est. {estimate.group(1)})" if estimate else "not run"

    cols = [(v, p) for p in ("forward", "forward+backward") for v in ("naive", "chunked")]
    out = [[f"{nc:,}", f"{nt:,}", *(mib(v, p, (nc, nt)) for v, p in cols)] for nc, nt in shapes]
    return table(["N_c", "N_t", *(f"{p}, {v}" for v, p in cols)], out)


def neighbour_search() -> str:
    small, large = read_csv("neighbour_search_cpu_nt1000.csv"), read_csv("neighbour_search_cpu.csv")
    cell, brute = "cell lists, median ms", "brute force (cdist + topk), median ms"
    by_small = {int(r["N_c"]): r for r in small}
    by_large = {int(r["N_c"]): r for r in large}
    ncs = sorted(set(by_small) | set(by_large))

    def get(rows: dict[int, dict[str, str]], n: int, key: str) -> str:
        value = rows.get(n, {}).get(key, "")
        return num(value) if value not in ("", "-") else "not run"

    out = [
        [f"{n:,}", get(by_small, n, cell), get(by_small, n, brute), get(by_large, n, cell), get(by_large, n, brute)]
        for n in ncs
    ]
    header = ["N_c", "N_t = 1,000: cell lists", "N_t = 1,000: brute force", "N_t = 10,000: cell lists"]
    return table([*header, "N_t = 10,000: brute force"], out)


def processor_speed() -> str:
    rows = read_csv("processor_speed_cpu.csv")
    grids = list(dict.fromkeys((r["grid"], r["tokens"]) for r in rows))
    by = {(r["grid"], r["processor"], r["pass"]): r["median ms"] for r in rows}
    cols = [(p, k) for k in ("forward", "forward+backward") for p in ("hypermixer", "transformer", "swin")]
    out = [[f"{g} ({num(t)})", *(num(by[(g, p, k)]) for p, k in cols)] for g, t in grids]
    names = {"hypermixer": "HyperMixer", "transformer": "MHSA", "swin": "Swin"}
    return table(["grid (tokens)", *(f"{names[p]} {k}" for p, k in cols)], out)


TABLES: dict[str, Callable[[], str]] = {
    "gp1d_tnp": gp1d_tnp,
    "gp2d_budget": gp2d_budget,
    "gp2d_table3_budget": gp2d_table3_budget,
    "joint_gp": joint_gp,
    "joint_gp_convcnp": lambda: joint_gp("joint_gp_convcnp_cpu.csv", 10),
    "joint_gp_convcnp_steps": lambda: joint_gp("joint_gp_convcnp_steps_cpu.csv", None),
    "joint_gp_convcnp_12k": lambda: joint_gp("joint_gp_convcnp_12k_cpu.csv", None),
    "era5_joint": era5_joint,
    "shifted_gp1d_paper": shifted_gp1d_paper,
    "era5_demo": era5_demo,
    "era5_residual_kriging": era5_residual_kriging,
    "era5_skill": era5_skill_table,
    "perf_vs_ref": perf_vs_ref,
    "perf_vs_ref_scaling": perf_vs_ref_scaling,
    "perf_vs_ref_devices": perf_vs_ref_devices,
    "te_memory": te_memory,
    "neighbour_search": neighbour_search,
    "processor_speed": processor_speed,
}


def render(text: str, page: str = "docs/results.md") -> tuple[str, list[str], set[str]]:
    """``text`` with every marked table regenerated, the names of the tables that changed and of those shown."""
    changed: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in TABLES:
            raise SystemExit(f"{page}: unknown table {name!r}; known: {', '.join(TABLES)}")
        body = TABLES[name]()
        if body != match.group("body"):
            changed.append(name)
        return match.group(1) + body + match.group(4)

    new = MARKER.sub(replace, text)
    return new, changed, {m.group("name") for m in MARKER.finditer(text)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if a table differs from its result files")
    parser.add_argument("--doc", type=Path, nargs="+", default=list(DOCS), help="the pages to render (default: all)")
    args = parser.parse_args(argv)
    stale, shown = [], set()
    for doc in args.doc:
        text = doc.read_text()
        new, changed, names = render(text, doc.name)
        shown |= names
        stale += [f"{doc.name}: {name}" for name in changed]
        if not args.check and new != text:
            doc.write_text(new)
    if set(args.doc) == set(DOCS):
        stale += [f"{name} (on no page)" for name in TABLES if name not in shown]
    if args.check:
        if stale:
            print(f"stale tables: {', '.join(stale)}; run python benchmarks/render_results.py")
            return 1
        return 0
    print(f"{len(stale)} table(s) rewritten" + (f": {', '.join(stale)}" if stale else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
