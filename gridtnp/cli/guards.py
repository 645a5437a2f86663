"""User mistakes caught before anything runs, each turned into one line that says what to do.

* ``check_checkpoint_model(ckpt, model_config)``: a checkpoint whose network differs from the recipe's is refused.
* ``argument_error_line(err, argv)``: jsonargparse's multi-line errors as one line, with the closest valid name.
* ``find_config_error(err)``: the ``ConfigError`` / ``CheckpointError`` in an exception's chain, if any.
* ``is_plot_folder(path)``: whether ``gridtnp plot`` may replace ``path``.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import inspect
import os
import re
from pathlib import Path
from typing import Any

import lightning as L
import torch

from gridtnp.registry import ConfigError, accepted_arguments
from gridtnp.training.checkpointing import CheckpointError


def check_checkpoint_model(ckpt_path: str | os.PathLike, model_config: Any) -> None:
    """Refuse a checkpoint whose model differs from the recipe's (``ConfigError`` naming the differing parts).

    ``model_config`` is the recipe's ``model`` entry (``class_path``, ``init_args``) as parsed. Only what defines
    the network is compared (the five slots, sizes and grid, each fully expanded), not the learning rate or
    schedule, so a recipe may change those for a resumed run.
    """
    from gridtnp.models.neural_process import MODEL_KEYS, expand_spec

    init_args = getattr(model_config, "init_args", None)
    if init_args is None:
        return
    hparams = torch.load(ckpt_path, map_location="cpu", weights_only=True).get("hyper_parameters") or {}
    keys = (*MODEL_KEYS, "preset")
    if not any(k in hparams for k in keys):
        return  # not a NeuralProcessModule checkpoint: nothing to compare

    def expanded(args: Any) -> dict[str, Any]:
        spec = {k: args.get(k) for k in keys}
        try:
            return expand_spec(spec)
        except (ConfigError, ValueError, TypeError) as err:
            return {"(cannot be built)": str(err)}

    recipe, checkpoint = expanded(init_args), expanded(hparams)
    differing = [k for k in dict.fromkeys([*recipe, *checkpoint]) if recipe.get(k) != checkpoint.get(k)]
    if differing:
        parts = [
            f"{k} (recipe: {_summary(recipe.get(k))}; checkpoint: {_summary(checkpoint.get(k))})" for k in differing
        ]
        raise ConfigError(
            f"--ckpt_path {ckpt_path} holds a different model than the recipe: {'; '.join(parts)}. Use the recipe it "
            "was trained with (fit saves it as config.yaml beside the checkpoints)."
        )


def _summary(value: Any) -> str:
    """A component spec by its registry name, anything else as written: short enough for one line."""
    if isinstance(value, dict) and "name" in value:
        return str(value["name"])
    return repr(value)


def is_plot_folder(path: Path) -> bool:
    """A folder holding nothing but PNG files (what ``gridtnp plot`` writes)."""
    return path.is_dir() and all(p.suffix == ".png" and p.is_file() for p in path.iterdir())


def argument_error_line(err: argparse.ArgumentError, argv: list[str]) -> str:
    """One line from jsonargparse's multi-line error: what was wrong, where, and the closest valid name."""
    text = str(err)
    option = re.search(r"class_path '([\w.]+)':\s+Option '([\w.]+)' is not accepted", text)
    if option:
        path, name = option.groups()
        name = name.split(".")[0]  # "procesor.name": the argument is "procesor"
        module, _, attr = path.rpartition(".")
        accepted = sorted(accepted_arguments(getattr(importlib.import_module(module), attr))[0])
        close = difflib.get_close_matches(name, accepted, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"{attr} has no argument {name!r}{hint}. Its arguments: {', '.join(accepted)}."
    unknown = re.match(r"unrecognized arguments: (.*)", text)
    if unknown:
        parts = []
        for token in unknown.group(1).split():
            if not token.startswith("--"):
                continue
            hint = ""
            if token.startswith("--trainer."):
                names = [n for n in inspect.signature(L.Trainer.__init__).parameters if n != "self"]
                close = difflib.get_close_matches(token.removeprefix("--trainer."), names, n=1)
                hint = f" (did you mean --trainer.{close[0]}?)" if close else ""
            parts.append(f"{token}{hint}")
        if parts:
            command = argv[0] if argv else "fit"
            return f"unrecognized argument(s) {', '.join(parts)}. `gridtnp {command} --help` lists them."
    keys = re.findall(r'Parser key "([\w.]+)"', text)
    if keys:
        path = ".init_args.".join(keys)  # a nested key is an argument of the class above it
        details = [line.strip(" -") for line in text.splitlines() if line.strip()]
        reasons = [line for line in details if line.startswith("Expected") or "Got value" in line]
        last = re.sub(r'Parser key "[\w.]+":\s*', "", details[-1])
        return f"--{path}: {'; '.join(reasons[:3]) or last}"
    return text.splitlines()[0]


def find_config_error(err: BaseException | None) -> ConfigError | CheckpointError | None:
    """The first ``ConfigError`` or ``CheckpointError`` in an exception's chain of causes and contexts."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, ConfigError | CheckpointError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None
