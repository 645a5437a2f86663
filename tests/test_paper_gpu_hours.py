"""The GPU-hours plan of the paper's tables (benchmarks/paper_gpu_hours.py): its budget file, its step times and the
section of docs/reproduce.md it renders."""

import csv
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpu_hours():
    spec = importlib.util.spec_from_file_location("paper_gpu_hours", ROOT / "benchmarks" / "paper_gpu_hours.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["paper_gpu_hours"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_reproduce_page_gpu_hours_match_result_files() -> None:
    """docs/reproduce.md's GPU-hours section equals what `paper_recipes_cost.py --plan` renders."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "paper_recipes_cost.py"), "--plan", "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_budget_has_every_paper_recipe_with_its_header_fpt(gpu_hours) -> None:
    """Every recipe under recipes/paper/ is one budget row, with the FPT and size its header quotes from the paper."""
    budget = yaml.safe_load(gpu_hours.BUDGET.read_text())
    rows = {r: spec for table in budget["tables"].values() for r, spec in table["rows"].items()}
    recipes = {p.stem for p in gpu_hours.RECIPES.glob("*.yaml")}
    assert set(rows) == recipes, (
        f"benchmarks/paper_training_budget.yaml lacks {sorted(recipes - set(rows))} and has no recipe for "
        f"{sorted(set(rows) - recipes)}: one row per recipes/paper/*.yaml"
    )
    for recipe, spec in rows.items():
        header = (gpu_hours.RECIPES / f"{recipe}.yaml").read_text()
        assert f"FPT {spec['fpt_ms']} ms" in header, recipe
        assert float(re.search(r"([\d.]+) M parameters", header).group(1)) == spec["params_m"], recipe
        assert spec.get("ratio_from", recipe) in rows, recipe


def write_csv(path: Path, rows: list[dict[str, str]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_gpu_measurement_replaces_the_cpu_ratio_estimate(gpu_hours, tmp_path: Path) -> None:
    """A recipe's GPU step time from gpu_training wins; another's is the paper's FPT x its CPU step/forward ratio."""
    cpu = {"device": "CPU: test, 1 torch threads", "forward_cpu_ms": "100", "params": "600000"}
    write_csv(
        tmp_path / "paper_recipes_cost_cpu_test.csv",
        [
            {**cpu, "recipe": "table4_tnp.yaml", "step_cpu_ms": "300"},
            {**cpu, "recipe": "table4_swin_pt_32x32.yaml", "step_cpu_ms": "250", "params": "1320000"},
        ],
    )
    write_csv(
        tmp_path / "gpu_training_table4_h200.csv",
        [
            {
                "measure": "gridtnp fit (consumed)",
                "notes": "100 steps after 20 warm-up, 10 s; step 72.0 ms",
                "command": "`python benchmarks/gpu_training.py recipes/paper/table4_swin_pt_32x32.yaml --minutes 1`",
                "device": "NVIDIA H200",
            }
        ],
    )
    budget = {
        "tables": {
            "table4": {
                "title": "Table 4: test",
                "steps": 1000,
                "steps_source": "App. X: a sentence",
                "gpu": "A100",
                "gpu_source": "App. D: a sentence",
                "runs": 2,
                "runs_source": "one per length-scale",
                "rows": {
                    "table4_tnp": {"fpt_ms": 17, "params_m": 0.60},
                    "table4_swin_pt_32x32": {"fpt_ms": 33, "params_m": 1.32},
                },
            }
        }
    }
    tables = gpu_hours.plan(budget, gpu_hours.cpu_ratios(tmp_path), gpu_hours.gpu_steps(tmp_path))
    tnp, swin = tables["table4"]
    assert tnp.measured is None and tnp.step_ms == pytest.approx(17 * 3.0)
    assert tnp.hours == pytest.approx(1000 * 51.0 * 2 / 3.6e6)
    assert swin.measured == "NVIDIA H200, `gpu_training_table4_h200.csv`" and swin.step_ms == 72.0
    assert swin.ratio == pytest.approx(2.5)
    text = gpu_hours.render(budget, tables)
    assert "| `table4_tnp` | 1,000 | 17 | 3.00 | 51.0 | estimate | 0.0 |" in text
    assert "| `table4_swin_pt_32x32` | 1,000 | 33 | 2.50 | 72.0 | measured: NVIDIA H200" in text
    assert "the training-step time of 1 of the 2 rows" in " ".join(text.split())
