"""A quiet CPU Lightning Trainer for tests that fit, validate or test a module in-process."""

from typing import Any

import lightning as L

QUIET = {
    "accelerator": "cpu",
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}


def quiet_trainer(**kwargs: Any) -> L.Trainer:
    """A Trainer on the CPU without logger, checkpoints, progress bar or model summary; ``kwargs`` add or override."""
    return L.Trainer(**{**QUIET, **kwargs})
