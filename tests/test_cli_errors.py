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

ROOT = Path(__file__).resolve().parents[1]
CNP = str(ROOT / "recipes" / "gp1d_cnp.yaml")
TNP = str(ROOT / "recipes" / "gp1d_tnp.yaml")
QUIET = ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]
SMALL_DATA = ["--data.init_args.test_batches", "1", "--data.init_args.batch_size", "2"]


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


def locked(directory: Path) -> Path:
    """A checkpoint folder whose lock is held by a live process (this test's parent)."""
    import os

    directory.mkdir(parents=True, exist_ok=True)
    (directory / ".gridtnp.lock").write_text(f"{os.getppid()} {__import__('socket').gethostname()}")
    return directory


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
        lambda ck, t: fit_args(t, "--data.init_args.batch_sizee", "2"),
        "SyntheticDataModule has no argument 'batch_sizee' (did you mean 'batch_size'?)",
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
        lambda ck, t: fit_args(t, "--data.init_args.batch_size", "0"),
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
            str(copy_of(t / "ckpt" / "last.ckpt", ck).parent),
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
