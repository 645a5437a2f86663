"""The marked tables of docs/results.md, performance.md and joint.md equal their result files (render_results.py)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_results_page_matches_result_files() -> None:
    """Every marked table of docs/results.md equals what render_results.py renders from the result files."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "render_results.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_results_page_stays_a_summary() -> None:
    """docs/results.md says what holds now, one section per measurement, details on their own pages."""
    lines = (ROOT / "docs" / "results.md").read_text().count("\n")
    assert lines <= 350, f"docs/results.md has {lines} lines; move a measurement's details to its own page"
