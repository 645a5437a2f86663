"""Regenerate the tables of ``docs/results.md`` from the result files under ``benchmarks/results/``.

Every table in the page sits between ``<!-- table: NAME -->`` and ``<!-- end table -->``; ``NAME`` is a key of
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
DOC = ROOT / "docs" / "results.md"
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


#: The gridded TNP paper's Table 3 test log-likelihood at l = 0.5 (500,000 steps of batch 8), for each recipe's row.
PAPER_TABLE3 = {
    "gp2d_paper_swin_pt": "0.844",
    "gp2d_paper_swin_ki": "0.844",
    "gp2d_paper_vit": "0.841",  # PT-GE 32 x 32 -> 16 x 16
    "gp2d_paper_convcnp": "0.801",  # the paper's plain CNN; this recipe is a U-Net (recipes/paper/ has the CNN)
    "gp2d_paper_pt_tnp_ist": "0.819",
    "gp2d_paper_cnp": "-0.406",
}


def gp2d_paper_budget() -> str:
    labels = {
        "gp2d_paper_swin_pt": "Swin-TNP, PT-GE",
        "gp2d_paper_swin_ki": "Swin-TNP, KI-GE",
        "gp2d_paper_vit": "ViTNP",
        "gp2d_paper_convcnp": "ConvCNP",
        "gp2d_paper_pt_tnp_ist": "PT-TNP, IST, M = 256",
        "gp2d_paper_cnp": "CNP",
    }
    rows = read_csv("gp2d_paper_budget_cpu.csv")
    body = [[*row, PAPER_TABLE3[r["recipe"]]] for row, r in zip(budget_rows(rows, labels), rows, strict=True)]
    return table([*budget_header(3), "paper, Table 3 log-likelihood"], body)


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


def shifted_gp1d() -> str:
    return shifted_rows("shifted_gp1d_cpu.csv", ["Delta = 0", "Delta = 0.5", "Delta = 1", "bimodal"])


# ---------------------------------------------------------------------------------------------------- ERA5
def era5_demo() -> str:
    run = read_json("era5_demo_cpu.json")["runs"][0]
    rows = [
        [f"`{k}`", *(fixed(v, 2 if k.startswith(("coverage", "mean_z2")) else 3) for v in vs)]
        for k, vs in run["metrics"].items()
    ]
    return table(["metric", *run["columns"]], rows)


def _readme_changes() -> dict[str, str]:
    """Variant name -> its change, from the tables of ``era5_skill/README.md``."""
    changes: dict[str, str] = {}
    for line in (RESULTS / "era5_skill" / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and line.startswith("| ") and cells[0] not in ("name", "---"):
            names = cells[0].split(", ")
            for name in names:
                if len(names) == 1 or not name.endswith("s1"):  # a listed seed-1 run is named "<base>, seed 1"
                    changes.setdefault(name, cells[1])
    return changes


def era5_skill(name: str, loglik: bool = True) -> str:
    """One row per variant of an ``era5_skill`` JSON-lines file: validation, test and layout scores."""
    records = read_jsonl(f"era5_skill/{name}")
    changes = _readme_changes()
    val = {r["config"]: r["scores"]["train"] for r in records if r["split"] == "val"}
    rows = []
    for r in records:
        if r["split"] != "test":
            continue
        variant = Path(r["config"]).stem
        base = variant[:-2] if variant.endswith("s1") else variant
        change = changes.get(variant) or (f"{base}, seed 1" if variant != base else "")
        s = r["scores"]
        train, cal = s["train"], s["train cal"]

        def moved(layout: str, train: dict = train, s: dict = s) -> str:
            change = round(100 * (s[layout]["rmse_heldout"] / train["rmse_heldout"] - 1))
            return f"{change:+d} %" if change else "0 %"

        row = [
            f"{variant}: {change}" if change and variant != change else variant,
            f"{val[r['config']]['rmse_all']:.3f}" if r["config"] in val else "",
            f"{train['rmse_heldout']:.3f}",
            f"{train['rmse_context']:.3f}",
            f"{train['rmse_all']:.3f}",
            moved("shifted"),
            moved("coarse3"),
            f"{train['coverage90_all']:.2f} ({cal['coverage90_all']:.2f})",
            f"{train['mean_z2_all']:.2f} ({cal['mean_z2_all']:.2f})",
        ]
        if loglik:
            row.append(f"{train['loglik_physical_all']:.2f} ({cal['loglik_physical_all']:.2f})")
        rows.append(row)
    header = [
        "variant",
        "val RMSE all",
        "test held-out",
        "test context",
        "test all",
        "shifted held-out",
        "3 x 3 held-out",
        "cov. 90 all (cal.)",
        "mean z^2 all (cal.)",
    ]
    return table(header + (["log-lik. all (cal.)"] if loglik else []), rows)


def era5_models() -> str:
    rows = read_json("era5_models_cpu.json")["rows"]
    header = ["recipe", "parameters", "test log-lik.", "RMSE (K)", "MAE (K)", "CRPS (K)", "90 % coverage"]
    keys = ("rmse", "mae", "crps")
    return table(
        header,
        [
            [
                r["recipe"] if r["recipe"].startswith("baseline") else f"`{r['recipe']}`",
                r["parameters"],
                r["test_loglik"],
                *(fixed(r[k]) for k in keys),
                fixed(r["coverage_90"], 2),
            ]
            for r in rows
        ],
    )


def era5_skill_table(name: str = "era5_skill_cpu.csv") -> str:
    """Models (the classical baselines beside them) per layout, from ``benchmarks/era5_skill.py --recipe ...``."""
    rows = read_csv(name)
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


def era5_mos_layouts() -> str:
    rows = read_json("era5_mos_cpu.json")["layouts"]
    header = ["regressors, per station", "fitted on one layout", "fitted over the 16 block offsets the model trains on"]
    return table(header, [[r["regressors"], fixed(r["one layout"]), fixed(r["16 offsets"])] for r in rows])


def data_loading() -> str:
    rows = read_csv("data_loading_cpu.csv")
    cases = list(dict.fromkeys(r["case"] for r in rows))
    by = {(r["case"], r["workers"]): r for r in rows}
    workers = sorted({r["workers"] for r in rows}, key=int)
    out = [
        [c, num(by[(c, workers[0])]["points_per_task"]), *(num(by[(c, w)]["tasks_per_s"]) for w in workers)]
        for c in cases
    ]
    return table(["case", "points per task", *(f"tasks/s, {w} workers" for w in workers)], out)


# --------------------------------------------------------------------------------------------------- speed
def forward_time_gp2d() -> str:
    rows = read_csv("forward_time_gp2d_cpu.csv")
    models = list(dict.fromkeys(r["model"] for r in rows))
    ncs = sorted({int(r["num_context"]) for r in rows})
    by = {(r["model"], int(r["num_context"]), r["passes"]): r for r in rows}

    def ms(m: str, n: int, p: str) -> str:
        r = by.get((m, n, p))
        return "" if r is None or not r["median_ms"] else num(r["median_ms"])

    out = [[f"`{m}`", *(ms(m, n, "forward") for n in ncs), ms(m, ncs[-1], "forward+backward")] for m in models]
    return table(["model", *(f"forward, N_c = {n:,}" for n in ncs), f"forward+backward, N_c = {ncs[-1]:,}"], out)


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
    "gp2d_paper_budget": gp2d_paper_budget,
    "gp2d_budget": gp2d_budget,
    "gp2d_table3_budget": gp2d_table3_budget,
    "shifted_gp1d_paper": shifted_gp1d_paper,
    "shifted_gp1d": shifted_gp1d,
    "era5_demo": era5_demo,
    "era5_ablation": lambda: era5_skill("ablation_cpu.jsonl"),
    "era5_residual": lambda: era5_skill("residual_cpu.jsonl", loglik=False),
    "era5_spread": lambda: era5_skill("spread_cpu.jsonl"),
    "era5_regression_climatology": lambda: era5_skill("regression_climatology_cpu.jsonl"),
    "era5_position": lambda: era5_skill_table("era5_skill/position_cpu.csv"),
    "era5_kriging": lambda: era5_skill_table("era5_skill/kriging_cpu.csv"),
    "era5_residual_kriging": era5_residual_kriging,
    "era5_mos_layouts": era5_mos_layouts,
    "era5_skill": era5_skill_table,
    "era5_models": era5_models,
    "data_loading": data_loading,
    "forward_time_gp2d": forward_time_gp2d,
    "perf_vs_ref": perf_vs_ref,
    "perf_vs_ref_scaling": perf_vs_ref_scaling,
    "te_memory": te_memory,
    "neighbour_search": neighbour_search,
    "processor_speed": processor_speed,
}


def render(text: str) -> tuple[str, list[str]]:
    """``text`` with every marked table regenerated, and the names of the tables that changed."""
    changed: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in TABLES:
            raise SystemExit(f"docs/results.md: unknown table {name!r}; known: {', '.join(TABLES)}")
        body = TABLES[name]()
        if body != match.group("body"):
            changed.append(name)
        return match.group(1) + body + match.group(4)

    return MARKER.sub(replace, text), changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if a table differs from its result files")
    parser.add_argument("--doc", type=Path, default=DOC, help="the page to render (default docs/results.md)")
    args = parser.parse_args(argv)
    text = args.doc.read_text()
    new, changed = render(text)
    if args.check:
        if changed:
            print(f"{args.doc.name} is stale in: {', '.join(changed)}; run python benchmarks/render_results.py")
            return 1
        return 0
    if new != text:
        args.doc.write_text(new)
    print(f"{len(changed)} table(s) rewritten" + (f": {', '.join(changed)}" if changed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
