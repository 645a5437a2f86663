"""``SaveConfig``: LightningCLI's config saver, credentials redacted, with a copy beside the checkpoints."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.cli import SaveConfigCallback

from gridtnp.files import atomic_write, is_url
from gridtnp.redaction import redact

CONFIG_NAME = "config.yaml"
#: The first line of the config.yaml beside the checkpoints: the recipe files it was resolved from, as given.
RECIPE_COMMENT = "# recipe: "


class SaveConfig(SaveConfigCallback):
    """LightningCLI's config saver that also writes the resolved config beside the checkpoints when fitting.

    Credentials (``gridtnp.redaction``) are replaced in every saved copy. When fitting, nothing is written until
    training starts, after a resumed checkpoint has been restored: a resume that fails leaves the saved recipe
    beside the checkpoints as it was (it still describes them).
    """

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            return  # written in on_train_start
        self._save(trainer, pl_module, stage)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._save(trainer, pl_module, "fit")

    def _save(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        config = self.config
        self.config = redact(config)
        try:
            super().setup(trainer, pl_module, stage)
        finally:
            self.config = config

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        text = self.parser.dump(self.config, skip_none=False).encode()
        recipes = [Path(str(c)).name for c in (self.config.get("config") or []) if c is not None]
        if recipes:  # the recipe's name, for the pages and lines that name a run by it (gridtnp report)
            text = f"{RECIPE_COMMENT}{', '.join(recipes)}\n".encode() + text
        for callback in trainer.checkpoint_callbacks:
            dirpath = getattr(callback, "dirpath", None)
            if dirpath and not is_url(dirpath):
                atomic_write(Path(dirpath) / CONFIG_NAME, lambda f: f.write(text))
