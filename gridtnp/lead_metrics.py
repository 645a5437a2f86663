"""Metrics per lead hour of forecast tasks: the ``{stage}/lead_<h>h/`` subsets of ``NeuralProcessModule``.

A forecast task's targets carry ``extras["lead_hours"] [B, Nt]`` (hours from the initial hour); every metric of
the evaluation is then also logged per lead, e.g. ``test/lead_6h/rmse_physical``, ``test/lead_6h/loglik``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from gridtnp.batch import Batch
from gridtnp.metrics import evaluation_metrics


def lead_prefix(hours: float) -> str:
    """The metric prefix of a lead: ``6.0 -> "lead_6h/"``, ``1.5 -> "lead_1.5h/"``."""
    return f"lead_{hours:g}h/"


def add_lead_groups(groups: torch.nn.ModuleDict, lead_hours: Sequence[float] | None) -> None:
    """Add the metric groups of each lead hour (validation, test, uncalibrated test) to ``groups`` (a module's
    ``group_metrics``, keyed ``"<stage>_<prefix without />"``); nothing for tasks without lead hours."""
    for hours in lead_hours or ():
        name = lead_prefix(float(hours)).strip("/")
        for key in (f"val_{name}", f"test_{name}", f"test_uncalibrated_{name}"):
            if key not in groups:
                groups[key] = torch.nn.ModuleDict(evaluation_metrics())


def lead_subsets(batch: Batch, weight: Tensor, lead_hours: Sequence[float] | None) -> dict[str, Tensor]:
    """``{"lead_<h>h/": weight [B, Nt] masked to the targets at lead h}`` for each of ``lead_hours`` (the
    DataModule's), from ``batch.extras["lead_hours"] [B, Nt]``; {} for batches without it."""
    hours = batch.extras.get("lead_hours")
    if hours is None or not lead_hours:
        return {}
    return {lead_prefix(float(h)): weight * (hours == float(h)) for h in lead_hours}
