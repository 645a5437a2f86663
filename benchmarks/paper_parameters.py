"""Parameter counts of the gridded TNP paper's recipes (recipes/paper/) beside the paper's Params column.

    python benchmarks/paper_parameters.py              # Markdown table on stdout
    python benchmarks/paper_parameters.py table1       # only recipes whose name starts with table1

The paper's count is read from each recipe's header (``Paper: ... X M parameters.``); tests/models/test_paper_recipes.py
checks those headers against the paper's tables and the 5 % tolerance. Builds the models only (seconds).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import yaml

from gridtnp.models import build_model, count_parameters

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "recipes" / "paper"
TRAINING_KEYS = ("lr", "weight_decay", "warmup_steps", "lr_schedule", "cos_latitude_weighting", "latitude_dim")


def paper_parameters(path: Path) -> float:
    """The paper's parameter count in millions, from the recipe's header."""
    match = re.search(r"([0-9.]+) M parameters", path.read_text())
    if match is None:
        raise ValueError(f"{path}: no 'Paper: ... X M parameters.' line in the header.")
    return float(match.group(1))


def gridtnp_parameters(path: Path) -> int:
    """Parameters of the model the recipe builds."""
    spec = yaml.safe_load(path.read_text())["model"]["init_args"]
    return count_parameters(build_model({k: v for k, v in spec.items() if k not in TRAINING_KEYS}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prefix", nargs="?", default="", help="only recipes whose file name starts with this")
    args = parser.parse_args(argv)
    print("| recipe | paper (M) | gridtnp (M) | difference |")
    print("|---|---|---|---|")
    for path in sorted(PAPER.glob(f"{args.prefix}*.yaml")):
        paper, ours = paper_parameters(path), gridtnp_parameters(path) / 1e6
        print(f"| {path.name} | {paper:.2f} | {ours:.3f} | {100 * (ours - paper) / paper:+.1f} % |")


if __name__ == "__main__":
    main()
