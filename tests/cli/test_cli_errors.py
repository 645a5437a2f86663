"""Bad inputs through the CLI: one ``gridtnp: error:`` line naming the file or argument, exit status 2, and nothing
on disk changed. Each row of ``CASES`` is one mistake a user or an operator makes."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from gridtnp.cli import main

ROOT = Path(__file__).resolve().parents[2]
CNP = str(ROOT / "recipes" / "gp1d_cnp.yaml")
TNP = str(ROOT / "recipes" / "gp1d_tnp.yaml")
QUIET = ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]
SMALL_DATA = ["--data.init_args.loader.test_batches", "1", "--data.init_args.loader.batch_size", "2"]


@pytest.fixture(scope="module")
def cnp_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-step CNP checkpoint of ``recipes/gp1d_cnp.yaml``."""
    root = tmp_path_factory.mktemp("cnp")
    main(
        ["fit", "--config", CNP, "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0", *QUIET,
         "--trainer.default_root_dir", str(root), "--checkpoint.dirpath", str(root / "ckpt"),
         "--plots.every_n_validations", "0"]
    )  # fmt: skip
    return root / "ckpt" / "last.ckpt"


def tree_digest(path: Path) -> str:
    """A digest of every file's relative path and bytes under ``path`` (or of the file itself)."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for p in files:
        digest.update(str(p.relative_to(path) if path.is_dir() else p.name).encode())
        digest.update(p.read_bytes())
    return digest.hexdigest()


def prepared_store(path: Path) -> Path:
    """A small Zarr store with a prepared store's attributes: what ``gridtnp predict`` must never replace."""
    ds = xr.Dataset({"t2m": (("time", "latitude", "longitude"), [[[280.0, 281.0]]])})
    ds.attrs["gridtnp_stats"] = "{}"
    ds.to_zarr(path, mode="w", zarr_format=2, consolidated=True)
    return path


def prediction_store(path: Path) -> Path:
    xr.Dataset({"mean": ("x", [1.0])}, attrs={"source": "gridtnp predictions"}).to_zarr(path)
    return path


def polar_file(path: Path) -> Path:
    ds = xr.Dataset(
        {"t2m": (("time", "latitude", "longitude"), [[[280.0], [281.0]]])},
        coords={"time": [np.datetime64("2020-01-01")], "latitude": [80.0, 100.0], "longitude": [0.0]},
    )
    ds.to_netcdf(path)
    return path


def text_file(path: Path) -> Path:
    path.write_text("my notes\n")
    return path


def folder_with_notes(path: Path) -> Path:
    path.mkdir()
    (path / "notes.txt").write_text("mine\n")
    return path


def truncated_copy(path: Path, of: Path) -> Path:
    path.write_bytes(of.read_bytes()[:2000])
    return path


def grid_file(
    path: Path,
    units: str = "K",
    lon: list[float] | None = None,
    start: str = "2020-01-01",
    dims: tuple[str, ...] = ("time", "latitude", "longitude"),
    extra: dict | None = None,
    time: list | None = None,
    lat: list[float] | None = None,
) -> Path:
    """A tiny gridded NetCDF file: 2 times x 2 latitudes x the given longitudes, ``t2m`` in ``units``."""
    lon = [0.0, 1.0, 2.0] if lon is None else lon
    lat = [50.0, 51.0] if lat is None else lat
    time = list(np.datetime64(start) + np.arange(2) * np.timedelta64(1, "h")) if time is None else time
    sizes = {"time": len(time), "latitude": len(lat), "longitude": len(lon), **(extra or {})}
    values = np.arange(np.prod([sizes[d] for d in dims]), dtype=np.float32).reshape([sizes[d] for d in dims])
    coords = {"time": time, "latitude": lat, "longitude": lon, **{k: np.arange(v) for k, v in (extra or {}).items()}}
    xr.Dataset({"t2m": (dims, values + 280.0, {"units": units})}, coords=coords).to_netcdf(path)
    return path


def foreign_checkpoint(path: Path, unsafe: bool = False) -> Path:
    """A torch file gridtnp did not write: plain values, or (``unsafe``) a pickled Python object."""
    import argparse

    torch_save = __import__("torch").save
    torch_save({"weights": [1.0]} if not unsafe else {"state_dict": {}, "obj": argparse.Namespace(a=1)}, path)
    return path


def copy_of(path: Path, of: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(of.read_bytes())
    return path


def resumable(directory: Path, of: Path) -> Path:
    """A checkpoint folder as fit leaves it: last.ckpt and the recipe it was trained with."""
    copy_of(directory / "last.ckpt", of)
    (directory / "config.yaml").write_text("# the recipe of last.ckpt\n")
    return directory


def locked(directory: Path) -> Path:
    """A checkpoint folder whose lock is held by a live process (this test's parent)."""
    import os

    directory.mkdir(parents=True, exist_ok=True)
    (directory / ".gridtnp.lock").write_text(f"{os.getppid()} {__import__('socket').gethostname()}")
    return directory


def locked_by_live_process(lock: Path) -> Path:
    """A lock file held by a live process (this test's parent), its parent folders made."""
    import os

    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(f"{os.getppid()} {__import__('socket').gethostname()}")
    return lock


def code_running_checkpoint(path: Path, marker: Path) -> Path:
    """A checkpoint with a training state whose pickle, unpickled with code allowed, writes ``marker``."""

    class Payload:
        def __reduce__(self):
            return (exec, (f"open({str(marker)!r}, 'w').write('ran')",))

    __import__("torch").save({"state_dict": {}, "global_step": 1, "payload": Payload()}, path)
    return path


def evil(tmp: Path) -> Path:
    """``tmp/e.ckpt``, a checkpoint that writes ``tmp/ran`` when unpickled with code allowed."""
    return code_running_checkpoint(tmp / "e.ckpt", tmp / "ran")


_SERVERS: list = []


def served(path: Path, user: str = "") -> str:
    """``path``'s address on a local HTTP server (``user``: credentials written into the address)."""
    from tests.http_server import LocalHTTPServer

    server = LocalHTTPServer(path.parent).__enter__()
    _SERVERS.append(server)
    return server.url(path.name).replace("http://", f"http://{user}@" if user else "http://")


@pytest.fixture(scope="module", autouse=True)
def _stop_servers():
    yield
    while _SERVERS:
        _SERVERS.pop().__exit__(None, None, None)


def module_with_import_effect(folder: Path, marker: Path) -> str:
    """The name of an importable module (``folder`` put on ``sys.path``) that writes ``marker`` when imported."""
    import sys

    folder.mkdir(parents=True, exist_ok=True)
    name = f"marker_module_{abs(hash(str(folder)))}"
    (folder / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\nclass Model: ...\n")
    sys.path.insert(0, str(folder))
    return name


def recipe_text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def eval_args(command: str, ck: Path | None, tmp: Path, *extra: str) -> list[str]:
    ckpt = ["--ckpt_path", str(ck)] if ck is not None else []
    return [command, "--config", CNP, *ckpt, *QUIET, *SMALL_DATA, "--trainer.default_root_dir", str(tmp / "run"),
            *extra]  # fmt: skip


# (id, arguments given the fixture paths, what the one error line says, the path that must not change)
Case = tuple[str, Callable[[Path, Path], list[str]], str, Callable[[Path, Path], Path | None]]


def fit_args(tmp: Path, *extra: str) -> list[str]:
    return ["fit", "--config", CNP, *QUIET, "--trainer.default_root_dir", str(tmp / "run"), *extra]


CASES: list[Case] = [
    (
        "model key typo",
        lambda ck, t: fit_args(t, "--model.init_args.lrr", "0.1"),
        "no argument 'lrr' (did you mean 'lr'?)",
        lambda ck, t: t / "run",
    ),
    (
        "trainer key typo",
        lambda ck, t: fit_args(t, "--trainer.max_stepz", "5"),
        "--trainer.max_stepz (did you mean --trainer.max_steps?)",
        lambda ck, t: t / "run",
    ),
    (
        "data key typo",
        lambda ck, t: fit_args(t, "--data.init_args.loader.batch_sizee", "2"),
        "data.init_args.loader of SyntheticDataModule has no key 'batch_sizee' (did you mean 'batch_size'?)",
        lambda ck, t: t / "run",
    ),
    (
        "a value of the wrong type",
        lambda ck, t: fit_args(t, "--trainer.max_steps", "ten"),
        "--trainer.max_steps: Expected a <class 'int'>. Got value: ten",
        lambda ck, t: t / "run",
    ),
    (
        "negative learning rate",
        lambda ck, t: fit_args(t, "--model.init_args.lr", "-0.001"),
        "model lr must be a finite number > 0; got -0.001",
        lambda ck, t: t / "run",
    ),
    (
        "negative max_steps",
        lambda ck, t: fit_args(t, "--trainer.max_steps", "-5"),
        "--trainer.max_steps must be >= 0, or -1 for no limit; got -5",
        lambda ck, t: t / "run",
    ),
    (
        "a zero token width",
        lambda ck, t: fit_args(t, "--model.init_args.dim", "0"),
        "model sizes must be >= 1; got dim = 0",
        lambda ck, t: t / "run",
    ),
    (
        "model inputs that do not match the data",
        lambda ck, t: fit_args(t, "--model.init_args.dim_x", "2"),
        "the model takes 2-dimensional inputs (dim_x) but SyntheticDataModule's tasks have 1",
        lambda ck, t: None,
    ),
    (
        "a recipe that does not exist",
        lambda ck, t: ["fit", "--config", str(t / "nope.yaml")],
        "--config: File does not exist",
        lambda ck, t: None,
    ),
    (
        "unknown subcommand",
        lambda ck, tmp: ["fitt"],
        "unknown subcommand 'fitt'. Did you mean 'fit'?",
        lambda ck, t: None,
    ),
    (
        "test without a checkpoint",
        lambda ck, tmp: ["test", "--config", CNP, *QUIET, "--trainer.default_root_dir", str(tmp / "run")],
        "gridtnp test needs --ckpt_path",
        lambda ck, tmp: tmp / "run",
    ),
    (
        "predict without a checkpoint",
        lambda ck, tmp: ["predict", "--config", CNP, *QUIET, "--trainer.default_root_dir", str(tmp / "run")],
        "gridtnp predict needs --ckpt_path",
        lambda ck, tmp: tmp / "run",
    ),
    (
        "missing checkpoint file",
        lambda ck, tmp: ["test", "--config", CNP, "--ckpt_path", str(tmp / "nope.ckpt"), *QUIET],
        "nope.ckpt: no such file",
        lambda ck, tmp: None,
    ),
    (
        "truncated checkpoint",
        lambda ck, tmp: ["test", "--config", CNP, "--ckpt_path", str(truncated_copy(tmp / "cut.ckpt", ck)), *QUIET],
        "cut.ckpt is truncated",
        lambda ck, tmp: tmp / "cut.ckpt",
    ),
    (
        "checkpoint of another model",
        lambda ck, tmp: ["test", "--config", TNP, "--ckpt_path", str(ck), *QUIET],
        "holds a different model than the recipe: ",
        lambda ck, tmp: ck,
    ),
    (
        "predictions onto a data store",
        lambda ck, tmp: [
            "predict",
            "--config",
            CNP,
            "--ckpt_path",
            str(ck),
            *QUIET,
            *SMALL_DATA,
            "--predictions.path",
            str(prepared_store(tmp / "era5.zarr")),
            "--predictions.overwrite",
            "true",
        ],
        "era5.zarr exists and is not a prediction file written by gridtnp; refusing to replace it",
        lambda ck, tmp: tmp / "era5.zarr",
    ),
    (
        "predictions onto an existing file",
        lambda ck, tmp: [
            "predict",
            "--config",
            CNP,
            "--ckpt_path",
            str(ck),
            *QUIET,
            *SMALL_DATA,
            "--predictions.path",
            str(text_file(tmp / "notes.nc")),
        ],
        "notes.nc already exists; pass --predictions.overwrite true",
        lambda ck, tmp: tmp / "notes.nc",
    ),
    (
        "plots into a folder of other files",
        lambda ck, tmp: [
            "plot",
            "--config",
            CNP,
            "--ckpt_path",
            str(ck),
            "--overwrite",
            *SMALL_DATA,
            "--out",
            str(folder_with_notes(tmp / "mine")),
        ],
        "mine exists and is not a plot folder written by gridtnp",
        lambda ck, tmp: tmp / "mine",
    ),
    (
        "plots into an existing folder",
        lambda ck, tmp: ["plot", "--config", CNP, "--ckpt_path", str(ck), "--out", str(folder_with_notes(tmp / "o"))],
        "already exists; pass --overwrite",
        lambda ck, tmp: tmp / "o",
    ),
    (
        "plot with a truncated checkpoint",
        lambda ck, tmp: [
            "plot",
            "--config",
            CNP,
            "--ckpt_path",
            str(truncated_copy(tmp / "cut.ckpt", ck)),
            "--out",
            str(tmp / "plots"),
        ],
        "cut.ckpt is truncated",
        lambda ck, tmp: tmp / "cut.ckpt",
    ),
    (
        "plot with a checkpoint of another model",
        lambda ck, tmp: ["plot", "--config", TNP, "--ckpt_path", str(ck), "--out", str(tmp / "plots"), *SMALL_DATA],
        "holds a different model than the recipe: ",
        lambda ck, tmp: ck,
    ),
    (
        "unknown processor",
        lambda ck, t: fit_args(t, "--model.init_args.processor", "{name: swinn}"),
        "Unknown processor 'swinn'. Did you mean 'swin'",
        lambda ck, t: t / "run",
    ),
    (
        "a component option out of range",
        lambda ck, t: fit_args(t, "--model.init_args.grid_decoder", "{name: concat, layers: 0}"),
        "mlp needs at least one layer",
        lambda ck, t: t / "run",
    ),
    (
        "negative weight decay",
        lambda ck, t: fit_args(t, "--model.init_args.weight_decay", "-1"),
        "model weight_decay must be a finite number >= 0; got -1",
        lambda ck, t: t / "run",
    ),
    (
        "an empty batch",
        lambda ck, t: fit_args(t, "--data.init_args.loader.batch_size", "0"),
        "batch_size",
        lambda ck, t: t / "run",
    ),
    (
        "an unknown precision",
        lambda ck, t: fit_args(t, "--trainer.precision", "17"),
        "--trainer.precision: Expected a typing.Literal",
        lambda ck, t: t / "run",
    ),
    (
        "an unknown component in gridtnp list",
        lambda ck, t: ["list", "processor", "swinn"],
        "Unknown processor 'swinn'. Did you mean 'swin'",
        lambda ck, t: None,
    ),
    (
        "prepare from a file that does not exist",
        lambda ck, t: ["data", "prepare", str(t / "missing.nc"), "--out", str(t / "s.zarr")],
        "missing.nc",
        lambda ck, t: t / "s.zarr",
    ),
    (
        "prepare onto an existing store without --overwrite",
        lambda ck, t: ["data", "prepare", str(t / "a.nc"), "--out", str(prepared_store(t / "s.zarr"))],
        "already exists; pass --overwrite",
        lambda ck, t: t / "s.zarr",
    ),
    (
        "prepare onto predictions",
        lambda ck, t: ["data", "prepare", str(t / "a.nc"), "--overwrite", "--out", str(prediction_store(t / "p.zarr"))],
        "did not write",
        lambda ck, t: t / "p.zarr",
    ),
    (
        "prepare inputs holding one variable in different units",
        lambda ck, t: [
            "data",
            "prepare",
            str(grid_file(t / "a.nc", "K")),
            str(grid_file(t / "b.nc", "degC", start="2020-01-02")),
            "--out",
            str(t / "s.zarr"),
        ],
        "variable 't2m' is in 'K' in",
        lambda ck, t: t / "s.zarr",
    ),
    (
        "prepare a 0-360 box across the date line",
        lambda ck, t: [
            "data",
            "prepare",
            str(grid_file(t / "a.nc", lon=[178.0, 179.0, 180.0, 181.0, 182.0])),
            "--out",
            str(t / "s.zarr"),
        ],
        "the longitudes cross the date line",
        lambda ck, t: t / "s.zarr",
    ),
    (
        "prepare a variable with two extra dimensions",
        lambda ck, t: [
            "data",
            "prepare",
            str(
                grid_file(
                    t / "a.nc",
                    dims=("time", "number", "level", "latitude", "longitude"),
                    extra={"number": 2, "level": 2},
                )
            ),
            "--out",
            str(t / "s.zarr"),
        ],
        "has 2 dimensions besides time, latitude and longitude (number, level)",
        lambda ck, t: t / "s.zarr",
    ),
    (
        "prepare with a missing (NaT) time",
        lambda ck, t: [
            "data",
            "prepare",
            str(grid_file(t / "a.nc", time=[np.datetime64("2020-01-01"), np.datetime64("NaT")])),
            "--out",
            str(t / "s.zarr"),
        ],
        "time value(s) are missing (NaT)",
        lambda ck, t: t / "s.zarr",
    ),
    (
        "prepare with a missing (NaN) latitude",
        lambda ck, t: [
            "data",
            "prepare",
            str(grid_file(t / "a.nc", lat=[50.0, float("nan")])),
            "--out",
            str(t / "s.zarr"),
        ],
        "latitude has missing (NaN) values",
        lambda ck, t: t / "s.zarr",
    ),
    (
        "prepare onto an existing file with --overwrite",
        lambda ck, t: [
            "data",
            "prepare",
            str(grid_file(t / "a.nc")),
            "--overwrite",
            "--out",
            str(text_file(t / "notes.zarr")),
        ],
        "exists and is not a Zarr store",
        lambda ck, t: t / "notes.zarr",
    ),
    (
        "test --ckpt_path last with no checkpoint anywhere",
        lambda ck, t: eval_args("test", None, t, "--ckpt_path", "last", "--checkpoint.dirpath", str(t / "none")),
        "(--ckpt_path last found no checkpoint)",
        lambda ck, t: t / "run",
    ),
    (
        "validate without a checkpoint",
        lambda ck, t: eval_args("validate", None, t),
        "gridtnp validate needs --ckpt_path",
        lambda ck, t: t / "run",
    ),
    (
        "test with --ckpt_path hpc",
        lambda ck, t: eval_args("test", None, t, "--ckpt_path", "hpc"),
        "--ckpt_path hpc only resumes `gridtnp fit`",
        lambda ck, t: t / "run",
    ),
    (
        "a log-likelihood monitored with mode min",
        lambda ck, t: fit_args(t, "--checkpoint.mode", "min"),
        "would keep the worst model",
        lambda ck, t: t / "run",
    ),
    (
        "a checkpoint filename leading outside its folder",
        lambda ck, t: fit_args(
            t, "--checkpoint.filename", "../../escaped-{step}", "--checkpoint.dirpath", str(t / "ckpt")
        ),
        "leads outside the checkpoint directory",
        lambda ck, t: t / "run",
    ),
    (
        "a checkpoint folder that is a file",
        lambda ck, t: fit_args(t, "--checkpoint.dirpath", str(text_file(t / "ckfile"))),
        "is a file, not a folder",
        lambda ck, t: t / "ckfile",
    ),
    (
        "max_time in Lightning's short format",
        lambda ck, t: fit_args(t, "--trainer.max_time", "00:00:08"),
        "expected days:hours:minutes:seconds",
        lambda ck, t: t / "run",
    ),
    (
        "checkpointing turned off",
        lambda ck, t: fit_args(t, "--trainer.enable_checkpointing", "false"),
        "gridtnp fit always writes last.ckpt",
        lambda ck, t: t / "run",
    ),
    (
        "64-bit precision",
        lambda ck, t: fit_args(t, "--trainer.precision", "64-true"),
        "use 32-true",
        lambda ck, t: t / "run",
    ),
    (
        "a seed out of range",
        lambda ck, t: fit_args(t, "--seed_everything", str(2**40)),
        "is not in bounds",
        lambda ck, t: t / "run",
    ),
    (
        "last.ckpt every 0 steps",
        lambda ck, t: fit_args(t, "--checkpoint.last_every_n_steps", "0"),
        "--checkpoint.last_every_n_steps must be >= 1",
        lambda ck, t: t / "run",
    ),
    (
        "a validation interval beyond the epoch",
        lambda ck, t: fit_args(
            t, "--trainer.val_check_interval", "100000", "--trainer.max_steps", "1", "--plots.every_n_validations", "0"
        ),
        "`val_check_interval` (100000) must be less than or equal to the number of the training batches",
        lambda ck, t: None,
    ),
    (
        "a resume whose recipe changed the model",
        lambda ck, t: [
            "fit",
            "--config",
            TNP,
            *QUIET,
            "--trainer.default_root_dir",
            str(t / "run"),
            "--checkpoint.dirpath",
            str(resumable(t / "ckpt", ck)),
        ],
        "holds a different model than the recipe",
        lambda ck, t: t / "ckpt",
    ),
    (
        "an unsafe pickle as --ckpt_path",
        lambda ck, t: eval_args("test", foreign_checkpoint(t / "evil.ckpt", unsafe=True), t),
        "not loadable safely",
        lambda ck, t: t / "evil.ckpt",
    ),
    (
        "a foreign file as --ckpt_path",
        lambda ck, t: eval_args("test", foreign_checkpoint(t / "other.ckpt"), t),
        "not a training checkpoint",
        lambda ck, t: t / "other.ckpt",
    ),
    (
        "a checkpoint folder in use by a live run",
        lambda ck, t: fit_args(t, "--checkpoint.dirpath", str(locked(t / "busy"))),
        "is in use by a running gridtnp fit",
        lambda ck, t: t / "busy",
    ),
    (
        "a recipe indented with tabs",
        lambda ck, t: ["fit", "--config", str(recipe_text(t / "tabs.yaml", "model:\n\tclass_path: x\n"))],
        "not valid YAML at line 2, column 1",
        lambda ck, t: None,
    ),
    (
        "an empty recipe",
        lambda ck, t: ["fit", "--config", str(recipe_text(t / "empty.yaml", ""))],
        "the recipe is empty",
        lambda ck, t: None,
    ),
    (
        "a loss that turns NaN",
        lambda ck, t: fit_args(
            t,
            "--model.init_args.lr",
            "1000",
            "--trainer.max_steps",
            "60",
            "--trainer.limit_val_batches",
            "0",
            "--plots.every_n_validations",
            "0",
            "--checkpoint.dirpath",
            str(t / "ckpt"),
        ),
        "at step",
        lambda ck, t: None,
    ),
    (
        "a checkpoint URL whose pickle runs code (test)",
        lambda ck, t: eval_args("test", None, t, "--ckpt_path", served(evil(t))),
        "checkpoint http://127.0.0.1:",
        lambda ck, t: t / "ran",
    ),
    (
        "a checkpoint URL whose pickle runs code (fit)",
        lambda ck, t: fit_args(t, "--ckpt_path", served(evil(t))),
        "is not loadable safely",
        lambda ck, t: t / "ran",
    ),
    (
        "a file:// checkpoint whose pickle runs code (predict)",
        lambda ck, t: eval_args("predict", None, t, "--ckpt_path", f"file://{evil(t)}"),
        "is not loadable safely",
        lambda ck, t: t / "ran",
    ),
    (
        "a checkpoint file whose pickle runs code (validate)",
        lambda ck, t: eval_args("validate", evil(t), t),
        "e.ckpt is not loadable safely: it holds the Python object exec, which is neither",
        lambda ck, t: t / "ran",
    ),
    (
        "a checkpoint whose pickle runs code (plot)",
        lambda ck, t: ["plot", "--config", CNP, "--ckpt_path", str(evil(t)), "--out", str(t / "figs")],
        "is not loadable safely",
        lambda ck, t: t / "ran",
    ),
    (
        "a checkpoint URL that cannot be downloaded, with a password in it",
        lambda ck, t: eval_args("test", None, t, "--ckpt_path", "http://user:pw123@127.0.0.1:9/x.ckpt"),
        "--ckpt_path http://user:***@127.0.0.1:9/x.ckpt: cannot download it",
        lambda ck, t: t / "run",
    ),
    (
        "a recipe class_path in a module with import side effects",
        lambda ck, t: [
            "fit",
            "--config",
            CNP,
            "--config",
            str(
                recipe_text(
                    t / "foreign.yaml",
                    f"model:\n  class_path: {module_with_import_effect(t / 'mods', t / 'ran')}.Model\n",
                )
            ),
        ],
        "gridtnp imports classes only from gridtnp, Lightning, torch and packages registered through",
        lambda ck, t: t / "ran",
    ),
    (
        "a callback class_path of a module not yet imported",
        lambda ck, t: fit_args(t, "--trainer.callbacks+=this.Zen"),
        "class_path 'this.Zen': gridtnp imports classes only from",
        lambda ck, t: t / "run",
    ),
    (
        "the default checkpoint folder in use by a live run",
        lambda ck, t: fit_args(t) if locked_by_live_process(t / "run" / "checkpoints" / ".gridtnp.lock") else [],
        "run/checkpoints is in use by a running gridtnp fit",
        lambda ck, t: t / "run",
    ),
    (
        "prepare onto an --out another prepare is writing",
        lambda ck, t: (
            ["data", "prepare", str(grid_file(t / "a.nc")), "--out", str(t / "s.zarr")]
            if locked_by_live_process(t / ".s.zarr.lock")
            else []
        ),
        "s.zarr is being written by another gridtnp data prepare (process",
        lambda ck, t: t / ".s.zarr.partial",
    ),
    (
        "prepare latitudes beyond the poles",
        lambda ck, t: ["data", "prepare", str(polar_file(t / "polar.nc")), "--out", str(t / "s.zarr")],
        "latitude 100 is outside [-90, 90]",
        lambda ck, t: t / "s.zarr",
    ),
]


@pytest.mark.parametrize(("args", "message", "unchanged"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_mistake_is_one_error_line_and_changes_nothing(args, message, unchanged, cnp_checkpoint, tmp_path, capsys):
    argv = args(cnp_checkpoint, tmp_path)
    guarded = unchanged(cnp_checkpoint, tmp_path)
    before = tree_digest(guarded) if guarded is not None and guarded.exists() else None
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("gridtnp: error:")]
    assert len(lines) == 1 and message in lines[0], lines
    if guarded is not None:
        if before is None:
            assert not guarded.exists(), f"{guarded} was created"
        else:
            assert tree_digest(guarded) == before, f"{guarded} changed"
    assert not (tmp_path / "plots").exists()


def test_the_mismatch_names_the_differing_components(cnp_checkpoint, capsys):
    with pytest.raises(SystemExit):
        main(["test", "--config", TNP, "--ckpt_path", str(cnp_checkpoint), *QUIET])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "processor (recipe: transformer; checkpoint: mean)" in line
    assert "grid_decoder (recipe: cross_attention; checkpoint: concat)" in line


def test_predictions_replace_only_predictions(cnp_checkpoint, tmp_path):
    out = tmp_path / "pred.nc"
    args = ["predict", "--config", CNP, "--ckpt_path", str(cnp_checkpoint), *QUIET, *SMALL_DATA,
            "--predictions.path", str(out), "--trainer.default_root_dir", str(tmp_path)]  # fmt: skip
    main(args)
    stamp = out.stat().st_mtime_ns
    main([*args, "--predictions.overwrite", "true"])  # its own earlier output: replaced
    assert out.stat().st_mtime_ns != stamp
    with xr.open_dataset(out) as ds:
        assert ds.attrs["source"] == "gridtnp predictions" and "mean" in ds


def test_untrained_on_purpose_and_the_top_level_help(tmp_path, capsys):
    main(["test", "--config", CNP, *QUIET, *SMALL_DATA, "--allow_untrained", "true",
          "--trainer.default_root_dir", str(tmp_path)])  # fmt: skip
    assert "test/loglik" in capsys.readouterr().out
    main(["--help"])
    out = capsys.readouterr().out
    for sub in ("fit", "validate", "test", "predict", "list", "plot", "data"):
        assert f"\n  {sub} " in out
    main(["--version"])
    assert capsys.readouterr().out.startswith("gridtnp 0.1.0")


# --- the predict API: context mistakes are one ConfigError each ------------------------------------------------------


def station_module():
    from gridtnp import NeuralProcessModule

    return NeuralProcessModule(
        dim_x=2, dim_y={"grid": 1, "stations": 1}, target_source="stations", dim=8,
        encoder={"name": "mlp"}, grid_encoder={"name": "identity"}, processor={"name": "transformer", "layers": 1},
        grid_decoder={"name": "cross_attention"}, likelihood={"name": "gaussian"},
    )  # fmt: skip


def hourly(hours: list[int], grid: bool) -> xr.DataArray:
    """Normalised values at ``hours`` of 2019-03-01: a 2 x 3 grid, or 4 stations."""
    time = np.datetime64("2019-03-01T00") + np.array(hours) * np.timedelta64(1, "h")
    rng = np.random.default_rng(len(hours) + 10 * grid)
    if grid:
        return xr.DataArray(
            rng.standard_normal((len(hours), 2, 3)), dims=("time", "latitude", "longitude"),
            coords={"time": time, "latitude": [50.0, 51.0], "longitude": [0.0, 1.0, 2.0]},
        )  # fmt: skip
    return xr.DataArray(
        rng.standard_normal((len(hours), 4)), dims=("time", "station"),
        coords={"time": time, "latitude": ("station", [50.2, 50.5, 50.7, 50.9]),
                "longitude": ("station", [0.1, 0.6, 1.2, 1.8])},
    )  # fmt: skip


TARGETS = xr.Dataset(coords={"latitude": [50.0, 50.5, 51.0], "longitude": [0.0, 1.0]})

# (id, keyword arguments of predict besides the module, what the ConfigError says)
API_CASES = [
    ("a misspelt source", lambda: {"context": {"gird": hourly([1], True).isel(time=0),
                                               "stations": hourly([1], False).isel(time=0)}},
     "context source 'gird' is not one of the model's sources ['grid', 'stations'] (did you mean 'grid'?)"),
    ("a model source missing", lambda: {"context": {"grid": hourly([1], True).isel(time=0)}},
     "the context lacks the model's source(s) ['stations']"),
    ("a batch_dim the context lacks", lambda: {"context": {"grid": hourly([1], True).isel(time=0),
                                                           "stations": hourly([1], False)}, "batch_dim": "time"},
     "context 'grid' has no dimension 'time' (batch_dim)"),
    ("an extra time dimension without batch_dim", lambda: {"context": {"grid": hourly([1, 2], True),
                                                                       "stations": hourly([1, 2], False)}},
     "pass batch_dim='time' for one task per time"),
    ("sources with different time lengths", lambda: {"context": {"grid": hourly([1, 2, 3], True),
                                                                 "stations": hourly([1, 2], False)},
                                                     "batch_dim": "time"},
     "'stations' has 2 entries along 'time' and 'grid' 3"),
    ("sources at other hours", lambda: {"context": {"grid": hourly([11, 12, 13], True),
                                                    "stations": hourly([20, 21, 22], False)}, "batch_dim": "time"},
     "context 'stations' covers other time values than 'grid'"),
]  # fmt: skip


@pytest.mark.parametrize(("kwargs", "message"), [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_a_predict_api_mistake_is_one_config_error(kwargs, message):
    from gridtnp.inference import predict
    from gridtnp.registry import ConfigError

    with pytest.raises(ConfigError) as err:
        predict(station_module(), targets=TARGETS, **kwargs())
    assert message in str(err.value) and "\n" not in str(err.value)


def test_predict_api_pairs_sources_by_time_and_reads_times_in_utc():
    import pandas as pd

    from gridtnp.inference import predict
    from gridtnp.inference.inputs import utc_times
    from gridtnp.registry import ConfigError

    module = station_module()
    grid, stations = hourly([11, 12, 13], True), hourly([11, 12, 13], False)
    ordered = predict(module, {"grid": grid, "stations": stations}, TARGETS, batch_dim="time")
    shuffled = predict(module, {"grid": grid.isel(time=[2, 1, 0]), "stations": stations}, TARGETS, batch_dim="time")
    np.testing.assert_allclose(shuffled["mean"].values, ordered["mean"].values, atol=1e-4)  # paired by time
    berlin = pd.Timestamp("2019-03-01 12:00", tz="Europe/Berlin")
    assert list(utc_times(berlin, "t").hour) == [11]
    assert list(utc_times(pd.date_range(berlin, periods=2, freq="h"), "t").hour) == [11, 12]
    cftime = pytest.importorskip("cftime")
    with pytest.raises(ConfigError, match="is a cftime date"):
        utc_times(np.array([cftime.DatetimeNoLeap(2019, 3, 1, 12)], dtype=object), "t")
    # Targets given as a Dataset whose first variable is a scalar: located by the gridded variable after it.
    targets = TARGETS.assign(note=1.0, field=(("latitude", "longitude"), np.zeros((3, 2))))
    out = predict(module, {"grid": grid.isel(time=0), "stations": stations.isel(time=0)}, targets)
    assert out["mean"].shape == (3, 2)


# --- what is converted, kept or versioned rather than refused ---------------------------------------------------------


def test_prepare_transposes_variables_to_the_layout(tmp_path):
    src = grid_file(tmp_path / "a.nc", dims=("latitude", "longitude", "time"))
    main(["data", "prepare", str(src), "--out", str(tmp_path / "s.zarr"), "--quiet"])
    with xr.open_zarr(tmp_path / "s.zarr") as ds, xr.open_dataset(src) as raw:
        assert ds["t2m"].dims == ("time", "latitude", "longitude")
        np.testing.assert_array_equal(ds["t2m"].values, raw["t2m"].transpose("time", ...).values)


def test_limits_stay_counts():
    """(The checkpoint's mode follows the metric: tests/training/test_monitor_mode.py.)"""
    from gridtnp.cli import GridTNPCLI

    cli = GridTNPCLI(run=False, args=["--config", CNP, "--trainer.limit_val_batches", "1", *QUIET])
    assert cli.trainer.limit_val_batches == 1 and isinstance(cli.trainer.limit_val_batches, int)  # one batch


def test_progress_lines_name_each_step_once_with_gradient_accumulation(capsys):
    from types import SimpleNamespace

    from gridtnp.cli.reports import ProgressLog

    log = ProgressLog(every_n_steps=1)
    trainer = SimpleNamespace(progress_bar_callback=None, is_global_zero=True, callback_metrics={}, max_steps=2)
    for step in (0, 0, 0, 1, 1, 1, 2, 2, 2):  # three accumulated batches per optimiser step
        trainer.global_step = step
        log.on_train_batch_end(trainer, None)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in lines] == ["gridtnp: step 1/2", "gridtnp: step 2/2"]


def test_credentials_never_reach_an_output():
    from gridtnp.redaction import REDACTED, redact, redact_text
    from gridtnp.training.checkpointing import Checkpoint

    hparams = {"store": "gs://bucket/era5.zarr", "storage_options": {"token": "s3cr3t", "project": "p"},
               "api_key": "abc", "self_key": True, "dim": 8}  # fmt: skip
    clean = redact(hparams)
    assert clean["storage_options"] == {"token": REDACTED, "project": REDACTED} and clean["api_key"] == REDACTED
    assert clean["self_key"] is True and clean["dim"] == 8 and hparams["storage_options"]["token"] == "s3cr3t"
    text = "data:\n  init_args:\n    storage_options:\n      token: s3cr3t\n"
    assert "s3cr3t" not in redact_text(text) and redact_text("a: 1  # kept\n") == "a: 1  # kept\n"
    checkpoint = {"hyper_parameters": {"dim": 8}, "datamodule_hyper_parameters": dict(hparams)}
    trainer = type("T", (), {"logger": None, "world_size": 1})()
    Checkpoint().on_save_checkpoint(trainer, None, checkpoint)
    assert "s3cr3t" not in repr(checkpoint) and hparams["storage_options"]["token"] == "s3cr3t"


def test_checkpoint_paths_stay_in_their_folder_and_foreign_files_are_skipped(cnp_checkpoint, tmp_path):
    import os

    import torch

    from gridtnp.training.checkpointing import CheckpointError, best_checkpoint, resume_checkpoint

    run = tmp_path / "ckpt"
    last = copy_of(run / "last.ckpt", cnp_checkpoint)
    outside = copy_of(tmp_path / "elsewhere" / "best.ckpt", cnp_checkpoint)
    state = torch.load(last, weights_only=False)
    state["callbacks"] = {"Checkpoint": {"best_model_path": str(outside), "monitor": "val/loglik",
                                         "best_model_score": torch.tensor(1.0)}}  # fmt: skip
    torch.save(state, last)
    with pytest.raises(CheckpointError, match="which lies outside"):  # not the file outside the folder
        best_checkpoint(run)
    copy_of(run / "best.ckpt", cnp_checkpoint)
    os.utime(last)  # last.ckpt stays the newest file, the one whose record is read
    assert best_checkpoint(run)[0] == run / "best.ckpt"
    foreign_checkpoint(run / "zz-newer.ckpt")
    (run / "best.ckpt").unlink()
    with pytest.warns(UserWarning, match="not a training checkpoint"):
        assert resume_checkpoint(None, [run], None) == last


def test_a_resume_applies_the_new_learning_rate_and_takes_over_a_stale_lock(cnp_checkpoint, tmp_path, capsys):
    import os
    import subprocess
    import sys

    import torch

    run = tmp_path / "ckpt"
    copy_of(run / "last.ckpt", cnp_checkpoint)
    (run / "config.yaml").write_text("kept: true\n")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run / ".gridtnp.lock").write_text(f"{dead.pid} {os.uname().nodename}")
    main(["fit", "--config", CNP, *QUIET, "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0",
          "--plots.every_n_validations", "0", "--checkpoint.dirpath", str(run), "--model.init_args.lr", "0.002",
          "--trainer.default_root_dir", str(tmp_path / "root")])  # fmt: skip
    out = capsys.readouterr().out
    assert f"from process {dead.pid}, which is no longer running" in out
    assert "resumed with the recipe's learning rate 0.002" in out
    state = torch.load(run / "last.ckpt", weights_only=False)
    assert state["global_step"] == 2 and state["optimizer_states"][0]["param_groups"][0]["lr"] == 0.002
    assert "lr: 0.002" in (run / "config.yaml").read_text() and not (run / ".gridtnp.lock").exists()


def test_test_time_model_options_apply_and_metrics_are_versioned(cnp_checkpoint, tmp_path):
    from gridtnp.cli import GridTNPCLI

    ckpt = copy_of(tmp_path / "ckpt" / "last.ckpt", cnp_checkpoint)
    args = eval_args("test", ckpt, tmp_path)
    weighted = GridTNPCLI(args=[*args, "--model.init_args.cos_latitude_weighting", "true"])
    assert weighted.model.latitude_dim == 0  # the checkpoint's hyper-parameters did not undo the option
    GridTNPCLI(args=args)
    GridTNPCLI(args=args)  # the same settings again: replaces its own file
    assert sorted(p.name for p in ckpt.parent.glob("*.json")) == ["last.test_metrics.1.json", "last.test_metrics.json"]


def test_the_table_holds_every_case():
    assert len(CASES) + len(API_CASES) >= 60


def test_predict_decodes_targets_in_chunks_with_the_same_result():
    from gridtnp.inference import predict

    module = station_module()
    context = {"grid": hourly([1, 2], True), "stations": hourly([1, 2], False)}
    whole = predict(module, context, TARGETS, batch_dim="time")
    chunked = predict(module, context, TARGETS, batch_dim="time", target_chunk=4)  # 2 targets per task and pass
    np.testing.assert_allclose(chunked["mean"].values, whole["mean"].values, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(chunked["std"].values, whole["std"].values, rtol=1e-5, atol=1e-6)


def test_machine_limits_and_read_only_paths_are_one_line():
    import errno

    import torch
    from jsonargparse import Namespace

    from gridtnp.cli.guards import environment_error_line
    from gridtnp.redaction import REDACTED, redact

    assert "out of memory" in environment_error_line(torch.OutOfMemoryError("CUDA out of memory. Tried 40 GiB"))
    assert "out of memory" in environment_error_line(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
    assert "batch_size" in environment_error_line(MemoryError())
    line = environment_error_line(OSError(errno.EROFS, "Read-only file system", "out.zarr"))
    assert line == "cannot write out.zarr: Read-only file system. Choose a writable path."
    assert environment_error_line(KeyError("a bug")) is None  # anything else keeps its traceback
    store = Namespace(path="gs://b", storage_options={"token": "s3cr3t"})
    config = Namespace(data=Namespace(init_args=Namespace(store=store)))
    assert redact(config).data.init_args.store.storage_options == {"token": REDACTED}
    assert config.data.init_args.store.storage_options == {"token": "s3cr3t"}


class RemoteSynthetic(__import__("gridtnp.data", fromlist=["SyntheticDataModule"]).SyntheticDataModule):
    """The synthetic tasks behind fsspec options, as a remote store's DataModule takes them.

    Args:
        storage_options: fsspec options (credentials).
        **kwargs: ``SyntheticDataModule``'s arguments.
    """

    def __init__(self, storage_options: dict | None = None, source: str | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.storage_options, self.source = storage_options, source


def test_a_token_reaches_no_output_file(tmp_path):
    """Tokens, AWS keys, a password in an address and a secret in a comment: in no file a run writes."""
    recipe = tmp_path / "remote.yaml"
    recipe.write_text(
        "# password: s3cr3t-in-a-comment\n"
        + Path(CNP).read_text().replace("gridtnp.data.SyntheticDataModule", "tests.cli.test_cli_errors.RemoteSynthetic")
        + "    storage_options: {token: s3cr3t-token, project: demo, key: AKIAS3CR3TS3CR3TS3CR, secret: s3cr3t-aws}\n"
        + "    source: http://user:s3cr3t-pw@127.0.0.1:9/era5.zarr\n"
    )
    common = [
        "--config",
        str(recipe),
        "--trainer.enable_progress_bar",
        "false",
        *SMALL_DATA,
        "--trainer.default_root_dir",
        str(tmp_path / "run"),
        "--checkpoint.dirpath",
        str(tmp_path / "ckpt"),
    ]
    main(["fit", *common, "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0",
          "--plots.every_n_validations", "0"])  # fmt: skip
    main(["predict", *common, "--ckpt_path", str(tmp_path / "ckpt" / "last.ckpt"),
          "--predictions.path", str(tmp_path / "pred.nc")])  # fmt: skip
    main(["report", "--config", str(recipe), "--ckpt_path", str(tmp_path / "ckpt" / "last.ckpt"), *SMALL_DATA,
          "--num_tasks", "1", "--out", str(tmp_path / "report.html")])  # fmt: skip
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p != recipe]
    names = {p.name for p in written}
    assert {"config.yaml", "last.ckpt", "hparams.yaml", "pred.nc", "report.html"} <= names
    assert any(name.startswith("events.out.tfevents") for name in names)
    leaked = [str(p.relative_to(tmp_path)) for p in written if b"s3cr3t" in p.read_bytes() or b"AKIA" in p.read_bytes()]
    assert not leaked
    page = (tmp_path / "report.html").read_text()
    assert "http://user:***@127.0.0.1:9/era5.zarr" in page and "REDACTED" in page  # the recipe, redacted


def test_ckpt_path_last_finds_the_newest_checkpoint(cnp_checkpoint, tmp_path, capsys):
    from gridtnp.cli import GridTNPCLI

    ckpt = copy_of(tmp_path / "ckpt" / "last.ckpt", cnp_checkpoint)
    cli = GridTNPCLI(
        args=eval_args("test", None, tmp_path, "--ckpt_path", "last", "--checkpoint.dirpath", str(ckpt.parent))
    )
    assert cli.trainer.ckpt_path == str(ckpt) and f"last checkpoint: {ckpt}" in capsys.readouterr().out


def test_a_checkpoint_url_is_tested_from_a_checked_local_copy(cnp_checkpoint, tmp_path, monkeypatch):
    import tempfile

    monkeypatch.chdir(tmp_path)
    url = served(copy_of(tmp_path / "served" / "good.ckpt", cnp_checkpoint))
    downloads = set(Path(tempfile.gettempdir()).glob("gridtnp-checkpoint-*"))
    main(eval_args("test", None, tmp_path, "--ckpt_path", url))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "served"]  # no http:/HOST/... folder
    assert set(Path(tempfile.gettempdir()).glob("gridtnp-checkpoint-*")) == downloads  # the copy is gone
    (metrics,) = (tmp_path / "run").rglob("test_metrics.json")
    assert __import__("json").loads(metrics.read_text())["checkpoint"] == url


def test_prepare_from_an_address_keeps_it_without_its_password(tmp_path):
    import json

    import zarr

    (tmp_path / "in").mkdir()
    url = served(grid_file(tmp_path / "in" / "a.nc"), user="user:s3cr3t-pw")
    main(["data", "prepare", url, "--out", str(tmp_path / "s.zarr"), "--quiet"])
    provenance = json.loads(json.dumps(dict(zarr.open_group(str(tmp_path / "s.zarr")).attrs)))["gridtnp_provenance"]
    shown = url.replace("s3cr3t-pw", "***")
    assert provenance["sources"] == [shown] and f"prepare {shown} --out" in provenance["command"]
    assert not [p for p in (tmp_path / "s.zarr").rglob("*") if p.is_file() and b"s3cr3t" in p.read_bytes()]


def test_two_fits_started_together_without_a_checkpoint_folder_get_their_own(tmp_path):
    import subprocess
    import sys

    args = [sys.executable, "-m", "gridtnp.cli", "fit", "--config", CNP, "--trainer.max_steps", "2",
            "--trainer.limit_val_batches", "0", "--plots.every_n_validations", "0",
            "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path)]  # fmt: skip
    runs = [subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2)]
    errors = [run.communicate(timeout=600)[1].decode() for run in runs]
    assert [run.returncode for run in runs] == [0, 0], errors
    folders = sorted(p.parent.parent.name for p in tmp_path.glob("lightning_logs/*/checkpoints/last.ckpt"))
    assert folders == ["version_0", "version_1"]


def test_a_stale_lock_is_taken_over_by_one_process_only(tmp_path):
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    from gridtnp.locks import LockBusy, release_lock, take_lock

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = tmp_path / ".gridtnp.lock"
    lock.write_text(f"{dead.pid} {__import__('socket').gethostname()}")

    def attempt(_: int):
        try:
            return take_lock(lock)
        except LockBusy:
            return None

    with ThreadPoolExecutor(8) as pool:  # each thread opens the file itself: one flock each, as processes have
        held = [h for h in pool.map(attempt, range(8)) if h is not None]
    assert len(held) == 1 and lock.read_text().split()[0] != str(dead.pid)
    release_lock(held[0])
    assert not lock.exists()
