"""``ResumingProgressBar``: Lightning's progress bar with its epoch, total and ETA also after a resume.

Lightning calls ``on_train_epoch_start`` (where its bar takes its total and its "Epoch N" description) only when
an epoch starts, not when a run resumes in the middle of one, so a resumed run's bar had no total and no ETA.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar


class ResumingProgressBar(TQDMProgressBar):
    """``TQDMProgressBar`` that, on a resume in the middle of an epoch, starts its bar as an epoch start would,
    counting the batches the resumed epoch had already done (the ETA is of what is left)."""

    def on_train_start(self, trainer: L.Trainer, *args: Any) -> None:
        super().on_train_start(trainer, *args)
        if getattr(trainer.fit_loop, "restarted_mid_epoch", False):
            self.on_train_epoch_start(trainer)
            bar = self.train_progress_bar
            done = int(trainer.fit_loop.epoch_loop.batch_progress.current.completed)
            bar.n = bar.last_print_n = bar.initial = done
            bar.refresh()
