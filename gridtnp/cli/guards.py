"""User mistakes caught before anything runs, each turned into one line that says what to do.

* ``check_checkpoint_model(ckpt, model_config)``: a checkpoint whose network differs from the recipe's is refused.
* ``argument_error_line(err, argv)``: jsonargparse's multi-line errors as one line, with the closest valid name.
* ``find_config_error(err)``: the ``ConfigError`` / ``CheckpointError`` in an exception's chain, if any.
* ``is_plot_folder(path)``: whether ``gridtnp plot`` may replace ``path``.
* ``check_trainer_options(config)``, ``count_limits(trainer, argv)``: trainer / checkpoint values checked (or read
  as meant) before anything is built (the checkpoint's mode follows its metric: ``training.checkpointing``);
  ``command_line_model_keys(argv)``: the ``--model.*`` given.
* ``environment_error_line(err)``: memory, read-only paths and Lightning's option checks as one line.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import importlib
import inspect
import os
import re
from pathlib import Path
from typing import Any

import lightning as L
import torch

from gridtnp.data.sections import moved_argument, section_key_error
from gridtnp.files import out_of_space
from gridtnp.registry import ConfigError, accepted_arguments
from gridtnp.training.checkpointing import CheckpointError


def check_checkpoint_model(ckpt_path: str | os.PathLike, model_config: Any) -> None:
    """Refuse a checkpoint whose model differs from the recipe's (``ConfigError`` naming the differing parts).

    ``model_config`` is the recipe's ``model`` entry (``class_path``, ``init_args``) as parsed. Only what defines
    the network is compared (the five slots, sizes and grid, each fully expanded), not the learning rate or
    schedule, so a recipe may change those for a resumed run.
    """
    from gridtnp.models.specs import MODEL_KEYS, expand_spec

    init_args = getattr(model_config, "init_args", None)
    if init_args is None:
        return
    from gridtnp.training.checkpoint_loading import load_checkpoint

    hparams = load_checkpoint(ckpt_path, mmap=True).get("hyper_parameters") or {}
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
    cause = find_config_error(err)
    if cause is not None:  # a check of gridtnp's inside jsonargparse (a class_path refused before its import)
        return str(cause)
    text = str(err)
    config = _recipe_argument(argv)
    if text.startswith("Problems parsing config"):
        where = re.search(r"line (\d+), column (\d+)", text)
        detail = " ".join(line.strip() for line in text.splitlines()[1:] if "<unicode string>" not in line)
        place = f" at line {where[1]}, column {where[2]}" if where else ""
        tabs = " (YAML indents with spaces, not tabs)" if "\t" in _read(config) else ""
        return f"--config {config}: not valid YAML{place}: {detail or text.splitlines()[0]}{tabs}."
    if text.strip() == "Unexpected config:":
        return f"--config {config}: the recipe is empty (or not a YAML mapping); expected model:, data:, trainer: ..."
    nested = re.search(
        r"class_path '([\w.]+)':\s+"
        r"(?:Group '(\w+)' does not accept option '(\w+)'|unrecognized arguments: --(\w+)\.(\w+)=)",
        text,
    )
    if nested:  # a key inside a DataModule's section (loader:, store:, ...)
        module, _, attr = nested[1].rpartition(".")
        line = section_key_error(
            getattr(importlib.import_module(module), attr), nested[2] or nested[4], nested[3] or nested[5]
        )
        if line:
            return line
    option = re.search(r"class_path '([\w.]+)':\s+Option '([\w.]+)' is not accepted", text)
    if option:
        path, name = option.groups()
        name = name.split(".")[0]  # "procesor.name": the argument is "procesor"
        module, _, attr = path.rpartition(".")
        moved = moved_argument(getattr(importlib.import_module(module), attr), name)
        if moved:
            return f"data.init_args.{name} moved to data.init_args.{moved} (a section of the recipe's data: keys)."
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


def _recipe_argument(argv: list[str]) -> str:
    """The last ``--config`` file on the command line (the one a parse error is most likely in)."""
    files = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"]
    files += [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
    return files[-1] if files else "(recipe)"


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return ""


def find_config_error(err: BaseException | None) -> ConfigError | CheckpointError | None:
    """The first ``ConfigError`` or ``CheckpointError`` in an exception's chain of causes and contexts."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, ConfigError | CheckpointError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def check_trainer_options(config: Any) -> None:
    """Trainer, seed and checkpoint values that Lightning rejects with a traceback (or reads otherwise than meant)."""
    trainer = config.get("trainer") or {}
    max_steps = trainer.get("max_steps")
    if max_steps is not None and max_steps < -1:
        raise ConfigError(f"--trainer.max_steps must be >= 0, or -1 for no limit; got {max_steps}.")
    max_time = trainer.get("max_time")
    if isinstance(max_time, str) and not re.fullmatch(r"\d+:\d{1,2}:\d{1,2}:\d{1,2}", max_time.strip()):
        raise ConfigError(
            f"--trainer.max_time {max_time!r}: expected days:hours:minutes:seconds, e.g. 00:12:00:00 for 12 hours "
            "(or a number of seconds in a recipe: {seconds: 30})."
        )
    if trainer.get("enable_checkpointing") is False and config.get("subcommand", "fit") in ("fit", None):
        raise ConfigError(
            "--trainer.enable_checkpointing false: gridtnp fit always writes last.ckpt (to resume and to test from); "
            "write it less often with --checkpoint.last_every_n_steps, or keep no best with --checkpoint.save_top_k 0."
        )
    precision = str(trainer.get("precision"))
    if precision in ("64", "64-true", "double"):
        raise ConfigError(
            f"--trainer.precision {precision}: gridtnp's data and models run in 32-bit (or bf16-mixed / 16-mixed); "
            "use 32-true."
        )
    dirpath = (config.get("checkpoint") or {}).get("dirpath")
    if dirpath and Path(dirpath).exists() and not Path(dirpath).is_dir():
        raise ConfigError(f"--checkpoint.dirpath {dirpath} is a file, not a folder; choose a folder.")


def count_limits(trainer: Any, argv: list[str]) -> None:
    """``--trainer.limit_*_batches N`` written as a whole number is N batches, not the fraction N (jsonargparse reads
    ``1`` as the float 1.0, which Lightning takes for 100 %)."""
    for option in ("limit_val_batches", "limit_train_batches", "limit_test_batches", "limit_predict_batches"):
        given = _command_line_value(argv, f"--trainer.{option}")
        if given is not None and re.fullmatch(r"\d+", given.strip()):
            trainer[option] = int(given)


def _command_line_value(argv: list[str], option: str) -> str | None:
    """The last value given to ``option`` on the command line (``--opt v`` or ``--opt=v``), or None."""
    value = None
    for i, token in enumerate(argv):
        if token == option and i + 1 < len(argv):
            value = argv[i + 1]
        elif token.startswith(option + "="):
            value = token.split("=", 1)[1]
    return value


def command_line_model_keys(argv: list[str]) -> list[str]:
    """The model arguments given on the command line (``--model.init_args.lr 1e-3`` or ``--model.lr=1e-3``)."""
    keys = []
    for token in argv:
        if token.startswith("--model."):
            key = token.removeprefix("--model.").split("=", 1)[0].removeprefix("init_args.").split(".")[0]
            if key and key not in ("class_path", "init_args", "dict_kwargs"):
                keys.append(key)
    return list(dict.fromkeys(keys))


def environment_error_line(err: BaseException) -> str | None:
    """One line for errors that are facts of the machine or of Lightning's option checks, not gridtnp bugs: memory,
    read-only or missing paths, Lightning's misconfiguration errors. None for anything else."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    text = (str(err).strip().splitlines() or [type(err).__name__])[0]
    out_of_memory = isinstance(err, MemoryError | torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower())
    )
    if out_of_memory:
        return (
            f"out of memory ({text[:160] or 'MemoryError'}): the batch or prediction grid is too large for this "
            "machine; use a smaller --data.init_args.batch_size or fewer target points."
        )
    if out_of_space(err):
        full = next((e for e in _chain(err) if getattr(e, "filename", None)), err)
        where = f" writing {full.filename}" if getattr(full, "filename", None) else ""
        return f"no space left on device{where}; free space or choose another output path."
    if isinstance(err, PermissionError | IsADirectoryError | NotADirectoryError | FileExistsError) or (
        isinstance(err, OSError) and err.errno in (errno.EROFS, errno.EACCES, errno.ENOSPC)
    ):
        where = f" {err.filename}" if getattr(err, "filename", None) else ""
        return f"cannot write{where}: {err.strerror or text}. Choose a writable path."
    if isinstance(err, MisconfigurationException) or (isinstance(err, ValueError) and _raised_by_lightning(err)):
        return f"{text} (Lightning)"
    return None


def _chain(err: BaseException | None) -> list[BaseException]:
    """``err`` and the errors it was raised from."""
    out: list[BaseException] = []
    while err is not None and len(out) < 20:
        out.append(err)
        err = err.__cause__ or err.__context__
    return out


def _raised_by_lightning(err: BaseException) -> bool:
    tb = err.__traceback__
    last = None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return last is not None and f"{os.sep}lightning{os.sep}" in last
