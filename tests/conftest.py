"""Shared fixtures: small deterministic batches."""

from __future__ import annotations

import importlib
import itertools
import os
import sys

import pytest
import torch

from gridtnp.batch import Observations
from gridtnp.nn.grids import Grid

# Under pytest-xdist (`make test`: a worker per core) each worker computes on its share of the cores, not on all.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _no_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests give the CLI its arguments (``GridTNPCLI(args=[...])``) as a notebook does: pytest's own options are
    not a command line for it (LightningCLI warns when it sees both)."""
    monkeypatch.setattr(sys, "argv", sys.argv[:1])


@pytest.fixture(autouse=True)
def _malloc_left_as_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process ``gridtnp data prepare`` calls leave this process's malloc settings as they are: the command sets
    them for its own process (``gridtnp.data.freed_memory``), which here would be every later test's.
    ``tests/data/test_freed_memory.py`` runs the command in a fresh interpreter."""
    monkeypatch.setattr("gridtnp.data.prepare.command.keep_freed_memory", lambda: False)


def random_context(b: int = 3, n: int = 12, dim_x: int = 1, dim_y: int = 1, p_valid: float = 0.7) -> Observations:
    """A padded context set with roughly ``p_valid`` real points per task (at least one)."""
    mask = torch.rand(b, n) < p_valid
    mask[:, 0] = True
    return Observations(torch.randn(b, n, dim_x), torch.randn(b, n, dim_y), mask, "context")


def grid_coords(grid: Grid) -> list[list[float]]:
    """Grid points row-major, by hand."""
    axes = []
    for lo, hi, m, r in zip(grid.lower, grid.upper, grid.shape, grid.roll, strict=True):
        step = (hi - lo) / (m if r else m - 1)
        axes.append([lo + i * step for i in range(m)])
    return [list(p) for p in itertools.product(*axes)]


def pytest_terminal_summary(terminalreporter) -> None:
    """How many bad inputs the table tests hold (``tests/cli/test_cli_errors.py``,
    ``tests/cli/test_bad_input_answers.py``), when they ran (under pytest-xdist they ran in the workers: the
    tables are read here from their modules)."""
    ran = {report.nodeid.split("::")[0] for reports in terminalreporter.stats.values() for report in reports
           if hasattr(report, "nodeid")}  # fmt: skip
    module = importlib.import_module("tests.cli.test_cli_errors") if "tests/cli/test_cli_errors.py" in ran else None
    if module is not None:
        cases = len(module.CASES) + len(module.API_CASES)
        terminalreporter.write_line(
            f"bad-input table: {cases} cases ({len(module.CASES)} through the CLI, {len(module.API_CASES)} through "
            "the predict API)"
        )
    if "tests/cli/test_bad_input_answers.py" in ran:
        answers = importlib.import_module("tests.cli.test_bad_input_answers")
        rows = {name: len(getattr(answers, name)) for name in getattr(answers, "TABLES", ("ERRORS", "ANSWERS"))}
        each = ", ".join(f"{n} {name}" for name, n in rows.items())
        terminalreporter.write_line(f"bad-input answers: {sum(rows.values())} cases ({each})")
