"""Validate one checkpoint on ``world`` gloo CPU ranks and write what each rank saw, for the world-size tests.

``python -m tests.training.validate_ranks CKPT OUT WORLD [LIMIT]``: each rank writes ``OUT/rank{r}.json`` with the
fingerprints of the validation batches it evaluated; rank 0 adds the reduced metrics ``trainer.validate`` returned.
Lightning's subprocess launcher starts ranks 1 .. WORLD-1 by running this command again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning as L

from gridtnp import NeuralProcessModule
from gridtnp.data import SyntheticDataModule
from tests.recording import fingerprint

#: The validation set of the world-size tests: 7 batches of 4 tasks (uneven on 2 and 4 ranks).
DATA = {"task": {"name": "gp1d"}, "loader": {"batch_size": 4, "train_batches": 4, "val_batches": 7, "seed": 3}}


class Seen(L.Callback):
    """Keep the fingerprint of every validation batch this rank evaluates."""

    def __init__(self) -> None:
        self.tasks: list[float] = []

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, *args: Any) -> None:
        self.tasks.append(fingerprint(batch))


def main(ckpt: str, out: str, world: int, limit: int | float | None = None) -> None:
    seen = Seen()
    trainer = L.Trainer(
        accelerator="cpu", devices=world, strategy="ddp" if world > 1 else "auto", logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, callbacks=[seen],
        limit_val_batches=1.0 if limit is None else limit,
    )  # fmt: skip
    module = NeuralProcessModule.load_from_checkpoint(ckpt, map_location="cpu")
    results = trainer.validate(module, SyntheticDataModule(**DATA), verbose=False)
    record: dict[str, Any] = {"rank": trainer.global_rank, "world_size": trainer.world_size, "tasks": seen.tasks}
    if trainer.is_global_zero:
        record["metrics"] = {k: float(v) for k, v in results[0].items()}
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    limit = None if len(sys.argv) < 5 else (float(sys.argv[4]) if "." in sys.argv[4] else int(sys.argv[4]))
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), limit)
