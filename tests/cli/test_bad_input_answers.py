"""Bad inputs that gave a wrong answer without a word, or buried their cause under a traceback or a misleading line.

Each row of ``ERRORS`` is one ``gridtnp: error:`` line naming the cause and the fix (exit status 2, the guarded path
unchanged), as in ``tests/cli/test_cli_errors.py``; each row of ``ANSWERS`` runs to the right result with the one
``gridtnp: warning:`` line that says what was done (or none, or the line a stopped command ends with); each row of
``READERS`` is one ``DataError`` line from a reader of the project's tables; ``API`` rows are ``predict`` results
with each dimension once; ``FIGURES`` rows draw text from the data as written.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import xarray as xr

from gridtnp.cli import main
from gridtnp.data.layout import DataError
from gridtnp.data.prepare import prepare
from tests.cli.test_cli_errors import CNP, QUIET, SMALL_DATA, cnp_checkpoint, copy_of, grid_file, tree_digest
from tests.data.test_era5 import LAT, STATIONS, field, write_stations

ROOT = Path(__file__).resolve().parents[2]
__all__ = ["cnp_checkpoint"]  # the module-scoped fixture, shared


def prepared(t: Path, name: str = "s.zarr", **kwargs: Any) -> Path:
    """A store prepared from ``grid_file``'s two steps of 2020-01-01 (``kwargs``: ``grid_file``'s)."""
    return prepare([grid_file(t / f"{name}.nc", **kwargs)], t / name, progress=False)


def archive_file(path: Path, start: str, valid_time_stop: str) -> Path:
    """``grid_file``'s data from ``start``, with an archive's ``valid_time_stop`` attribute."""
    with xr.open_dataset(grid_file(path.with_suffix(".raw.nc"), start=start)) as raw:
        ds = raw.load()
    ds.attrs["valid_time_stop"] = valid_time_stop
    ds.to_netcdf(path)
    return path


def fill_value_file(path: Path, fill: float = 3e38) -> Path:
    """Four hours of ``t2m`` = 280 K with one undeclared fill value."""
    values = np.full((4, 2, 3), 280.0, dtype=np.float32)
    values[1, 0, 0] = fill
    time = np.datetime64("2020-01-01") + np.arange(4) * np.timedelta64(1, "h")
    coords = {"time": time, "latitude": [50.0, 51.0], "longitude": [0.0, 1.0, 2.0]}
    xr.Dataset({"t2m": (("time", "latitude", "longitude"), values, {"units": "K"})}, coords=coords).to_netcdf(path)
    return path


def disk_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every Zarr array write fails as on a full disk."""
    import zarr

    def full(self: Any, *args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "c/0/0/0")

    monkeypatch.setattr(zarr.Array, "__setitem__", full)


def netcdf_disk_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every NetCDF write fails as on a full disk: HDF5's own error, and no space left."""
    import shutil

    def full(self: Any, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("NetCDF: HDF error")

    usage = shutil.disk_usage
    monkeypatch.setattr(xr.Dataset, "to_netcdf", full)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(path)._replace(free=0))


def quick_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    """dask.distributed gives up connecting after a second (default: 30 s)."""
    import dask

    monkeypatch.setitem(dask.config.config["distributed"]["comm"]["timeouts"], "connect", "1s")


def best_outside(t: Path, ck: Path) -> Path:
    """A run folder whose last.ckpt names an existing checkpoint outside the folder as the best."""
    last = copy_of(t / "ckpt" / "last.ckpt", ck)
    outside = copy_of(t / "elsewhere" / "best.ckpt", ck)
    state = torch.load(last, weights_only=False)
    state["callbacks"] = {"Checkpoint": {"best_model_path": str(outside), "monitor": "val/loglik",
                                         "best_model_score": torch.tensor(1.0)}}  # fmt: skip
    torch.save(state, last)
    return t / "ckpt"


def other_box(t: Path) -> list[str]:
    """Data arguments of a store and stations 10 degrees north of the MOS recipes' table (50-58 N, 10 W-2 E)."""
    ds = field().assign_coords(lat=LAT + 10.0)
    ds.to_netcdf(t / "north.nc")
    store = prepare(
        [t / "north.nc"], t / "north.zarr", train_start="2020-01-01", train_end="2020-01-02", progress=False
    )
    stations = write_stations(t / "north.csv", [(lat + 10.0, lon) for lat, lon in STATIONS])
    return [
        "--data.init_args.store.path", str(store), "--data.init_args.stations", stations,
        "--data.init_args.splits.train", '["2020-01-01", "2020-01-02"]',
        "--data.init_args.splits.val", '["2020-01-03", "2020-01-03"]',
        "--data.init_args.splits.test", '["2020-01-04", "2020-01-04"]',
        "--data.init_args.loader.train_batches", "2", "--data.init_args.loader.batch_size", "2",
    ]  # fmt: skip


def mos_fit(recipe: str, t: Path) -> list[str]:
    return ["fit", "--config", str(ROOT / "recipes" / recipe), *QUIET, "--trainer.max_steps", "1",
            "--trainer.default_root_dir", str(t / "run"), *other_box(t)]  # fmt: skip


# (id, arguments given the checkpoint, the test's folder and a MonkeyPatch, what the one error line says, the path
# that must not change)
Arrange = Callable[[Path, Path, pytest.MonkeyPatch], list[str]]
ERRORS: list[tuple[str, Arrange, str, Callable[[Path], Path | None]]] = [
    (
        "era5_mos on a store of another box",
        lambda ck, t, mp: mos_fit("era5_mos.yaml", t),
        "grid decoder 'mos': its places cover latitude 50 to 58, longitude -10 to 2 but StationReanalysisDataModule's "
        "targets lie at latitude 60 to 62",
        lambda t: None,  # the model's check of the data runs once the run's folder is made
    ),
    (
        "era5_mos_kriging on a store of another box",
        lambda ck, t, mp: mos_fit("era5_mos_kriging.yaml", t),
        "set the recipe's grid_decoder places to the data's box, {lower: [60.0, -1.0], upper: [62.0, 1.0], "
        "shape: [9, 9]}",
        lambda t: None,
    ),
    (
        "append of an input whose valid_time_stop removes all its steps",
        lambda ck, t, mp: [
            "data",
            "prepare",
            str(archive_file(t / "c.nc", "2020-01-03", "2020-01-01")),
            "--out",
            str(prepared(t)),
            "--append",
            "--quiet",
        ],
        "c.nc holds final data to 2020-01-01 (valid_time_stop): no step of final data after the store's last step",
        lambda t: t / "s.zarr",
    ),
    (
        "prepare onto a full disk",
        lambda ck, t, mp: disk_full(mp) or ["data", "prepare", str(grid_file(t / "a.nc")), "--out", str(t / "s.zarr")],
        "no space left on device writing",
        lambda t: t / "s.zarr",
    ),
    (
        "prepare with an unreachable --scheduler",
        lambda ck, t, mp: (
            quick_connect(mp)
            or [
                "data",
                "prepare",
                str(grid_file(t / "a.nc")),
                "--out",
                str(t / "s.zarr"),
                "--scheduler",
                "tcp://127.0.0.1:9",
            ]
        ),
        "--scheduler tcp://127.0.0.1:9: no dask.distributed scheduler reached",
        lambda t: t / "s.zarr",
    ),
    (
        "prepare with a malformed --scheduler",
        lambda ck, t, mp: [
            "data",
            "prepare",
            str(grid_file(t / "a.nc")),
            "--out",
            str(t / "s.zarr"),
            "--scheduler",
            "my scheduler",
        ],
        "--scheduler my scheduler: no dask.distributed scheduler reached",
        lambda t: t / "s.zarr",
    ),
    (
        "predict to NetCDF onto a full disk",
        lambda ck, t, mp: (
            netcdf_disk_full(mp)
            or [
                "predict",
                "--config",
                CNP,
                "--ckpt_path",
                str(ck),
                *QUIET,
                *SMALL_DATA,
                "--predictions.path",
                str(t / "p.nc"),
                "--trainer.default_root_dir",
                str(t / "run"),
            ]
        ),
        "p.nc; free space or choose another --predictions.path",
        lambda t: t / "p.nc",
    ),
    (
        "--ckpt_path best naming an existing checkpoint outside the run's folder",
        lambda ck, t, mp: [
            "test",
            "--config",
            CNP,
            *QUIET,
            *SMALL_DATA,
            "--ckpt_path",
            "best",
            "--checkpoint.dirpath",
            str(best_outside(t, ck)),
            "--trainer.default_root_dir",
            str(t / "run"),
        ],
        "as the best checkpoint, which lies outside",
        lambda t: t / "elsewhere",
    ),
]


@pytest.mark.parametrize(("arrange", "message", "unchanged"), [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS])
def test_the_cause_is_one_error_line(arrange, message, unchanged, cnp_checkpoint, tmp_path, monkeypatch, capsys):
    argv = arrange(cnp_checkpoint, tmp_path, monkeypatch)
    guarded = unchanged(tmp_path)
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


def fill_value_stats(t: Path) -> None:
    with xr.open_zarr(t / "s.zarr") as ds:
        stats = ds.attrs["gridtnp_stats"]
        assert stats["t2m"]["mean"] == pytest.approx(280.0) and stats["t2m"]["std"] == pytest.approx(0.0)
        assert int(ds["t2m"].isnull().sum()) == 1 and float(ds["t2m"].max()) == 280.0


def date_line_longitudes(t: Path) -> None:
    with xr.open_zarr(t / "s.zarr") as ds:
        assert ds["longitude"].values.tolist() == [-180.0, -179.0, -178.0, 178.0, 179.0]


def stopped_after_the_first_batch(t: Path) -> None:
    with xr.open_dataset(t / "p.nc") as ds:
        assert ds.attrs["gridtnp_incomplete"] == "stopped by SIGTERM after batch 1 of 3"
        assert ds.sizes["task"] == 2 and bool(np.isfinite(ds["mean"]).any())  # the first batch's two tasks


def sigterm_at_the_first_batch(mp: pytest.MonkeyPatch) -> None:
    """``gridtnp predict`` receives SIGTERM while its first batch is predicted."""
    import os
    import signal

    from gridtnp.inference.predictions import PredictionWriter

    write = PredictionWriter.write_on_batch_end

    def signalled(self: Any, trainer: Any, *args: Any, **kwargs: Any) -> None:
        if args[-1] == 0:  # batch_idx
            os.kill(os.getpid(), signal.SIGTERM)
        write(self, trainer, *args, **kwargs)

    mp.setattr(PredictionWriter, "write_on_batch_end", signalled)


# (id, arguments given the checkpoint, the test's folder and a MonkeyPatch, the one line's text (None: no warning
# line), the check of the result, the exit status (None: the command returns))
ANSWERS: list[tuple[str, Arrange, str | None, Callable[[Path], None], int | None]] = [
    (
        "one undeclared fill value (3e38) in a prepare input",
        lambda ck, t, mp: ["data", "prepare", str(fill_value_file(t / "a.nc")), "--out", str(t / "s.zarr"), "--quiet"],
        "t2m: 1 value(s) beyond +-1e30 or infinite (a fill value the input does not declare",
        fill_value_stats,
        None,
    ),
    (
        "an infinite value in a prepare input",
        lambda ck, t, mp: [
            "data",
            "prepare",
            str(fill_value_file(t / "a.nc", np.inf)),
            "--out",
            str(t / "s.zarr"),
            "--quiet",
        ],
        "are stored as missing (NaN), outside the statistics",
        fill_value_stats,
        None,
    ),
    (
        "a regional NetCDF across the date line with a --region across it",
        lambda ck, t, mp: [
            "data",
            "prepare",
            str(grid_file(t / "a.nc", lon=[178.0, 179.0, 180.0, 181.0, 182.0])),
            "--out",
            str(t / "s.zarr"),
            "--quiet",
            "--region",
            "40",
            "60",
            "170",
            "-170",
        ],
        None,
        date_line_longitudes,
        None,
    ),
    (
        "SIGTERM during gridtnp predict",
        lambda ck, t, mp: (
            sigterm_at_the_first_batch(mp)
            or [
                "predict",
                "--config",
                CNP,
                "--ckpt_path",
                str(ck),
                *QUIET,
                "--data.init_args.loader.test_batches",
                "3",
                "--data.init_args.loader.batch_size",
                "2",
                "--predictions.path",
                str(t / "p.nc"),
                "--trainer.default_root_dir",
                str(t / "run"),
            ]
        ),
        "gridtnp: predict stopped by SIGTERM after batch 1 of 3: the predictions so far are in",
        stopped_after_the_first_batch,
        128 + 15,
    ),
]


@pytest.mark.parametrize(("arrange", "line", "check", "status"), [c[1:] for c in ANSWERS], ids=[c[0] for c in ANSWERS])
def test_the_answer_is_right_and_said(arrange, line, check, status, cnp_checkpoint, tmp_path, monkeypatch, capsys):
    argv = arrange(cnp_checkpoint, tmp_path, monkeypatch)
    if status is None:
        main(argv)
    else:
        with pytest.raises(SystemExit) as err:
            main(argv)
        assert err.value.code == status
    said = [
        s for s in capsys.readouterr().err.splitlines() if s.startswith("gridtnp: warning:") or (line and line in s)
    ]
    assert said == [] if line is None else (len(said) == 1 and line in said[0]), said
    check(tmp_path)


def csv_file(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


OBSERVATIONS = "station_id,time,latitude,longitude,value\n"
READERS: list[tuple[str, Callable[[Path], Any], str]] = [
    (
        "a stations CSV row with a field too many",
        lambda t: __import__("gridtnp.data.stations", fromlist=["x"]).read_stations(
            csv_file(t / "s.csv", "latitude,longitude\n50,0\n\n51,1,9\n52,1\n")
        ),
        "s.csv: line 4 has 3 fields but the header has 2 (latitude, longitude)",
    ),
    (
        "an observations CSV whose first row has a field too many",
        lambda t: __import__("gridtnp.data.observations.table", fromlist=["x"]).read_table(
            csv_file(t / "o.csv", OBSERVATIONS + "A,2020-01-01T00,50,0,1,7\nB,2020-01-01T00,51,1,2\n")
        ),
        "o.csv: line 2 has 6 fields but the header has 5",
    ),
    (
        "an observations CSV with an unclosed quote",
        lambda t: __import__("gridtnp.data.observations.table", fromlist=["x"]).read_table(
            csv_file(t / "o.csv", OBSERVATIONS + 'A,2020-01-01T00,50,0,1\n"B,2020-01-01T00,51,1,2\nC,x,1,1,1\n')
        ),
        "o.csv: line 3 opens a quote that is never closed",
    ),
]


@pytest.mark.parametrize(("read", "message"), [c[1:] for c in READERS], ids=[c[0] for c in READERS])
def test_a_bad_table_row_is_one_line_naming_it(read, message, tmp_path):
    with pytest.raises(DataError) as err:
        read(tmp_path)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def predict_with_targets_along(batch_dim_of_targets: bool, grid: bool) -> xr.Dataset:
    """``predict`` with ``batch_dim="time"`` and targets given as a field (or stations) with that time axis too."""
    from gridtnp.inference import predict
    from tests.cli.test_cli_errors import hourly, station_module

    context = {"grid": hourly([1, 2], True), "stations": hourly([1, 2], False)}
    targets = hourly([1, 2], grid) if batch_dim_of_targets else hourly([1, 2], grid).isel(time=0, drop=True)
    return predict(station_module(), context, targets, batch_dim="time")


# (id, the call, the dimensions of its mean)
API: list[tuple[str, Callable[[], xr.Dataset], tuple[str, ...]]] = [
    ("predict targets that carry the batch dimension (a field)", lambda: predict_with_targets_along(True, True),
     ("time", "latitude", "longitude")),
    ("predict targets that carry the batch dimension (stations)", lambda: predict_with_targets_along(True, False),
     ("station", "time")),
]  # fmt: skip


@pytest.mark.parametrize(("call", "dims"), [c[1:] for c in API], ids=[c[0] for c in API])
def test_a_predict_api_result_has_each_dimension_once(call, dims):
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Duplicate dimension names")
        out = call()
    assert out["mean"].dims == dims and out["mean"].sizes["time"] == 2


def station_figures(units: str) -> dict[str, Any]:
    """``gridtnp plot``'s and ``gridtnp report``'s figures (``split_figures``) of a hand-made station evaluation
    whose variable has ``units``."""
    import types

    from gridtnp.report.evaluation_plots import split_figures

    rng = np.random.default_rng(0)
    time = np.datetime64("2020-01-01T00") + np.arange(3) * np.timedelta64(1, "h")
    attrs = {"units": units, "long_name": "2 metre temperature"}
    values = {k: (("station", "time"), rng.standard_normal((4, 3)) + 280.0, attrs) for k in ("mean", "observed")}
    physical = xr.Dataset(
        {**values, "std": (("station", "time"), np.full((4, 3), 0.5), attrs)},
        coords={"time": time, "latitude": ("station", [50.0, 51.0, 52.0, 53.0]),
                "longitude": ("station", [0.0, 1.0, 2.0, 3.0])},
    )  # fmt: skip
    out = {"mean": torch.zeros(1, 4, 1), "std": torch.ones(1, 4, 1), "y": torch.randn(1, 4, 1),
           "mask": torch.ones(1, 4, dtype=torch.bool)}  # fmt: skip
    evaluation = types.SimpleNamespace(physical=physical, split="test", num_tasks=1, tasks=[], outputs=[out],
                                       calibrated=False)  # fmt: skip
    return split_figures(evaluation, None, types.SimpleNamespace(geographic=True), geographic=True)


# (id, the figures, a label one of them must show as written)
FIGURES: list[tuple[str, Callable[[], dict[str, Any]], str]] = [
    ("a units attribute in matplotlib math syntax", lambda: station_figures("$K^{-1$"), "RMSE [$K^{-1$]"),
]


@pytest.mark.parametrize(("build", "label"), [c[1:] for c in FIGURES], ids=[c[0] for c in FIGURES])
def test_figures_draw_the_data_s_text_as_written(build, label):
    import io

    figures = build()
    for figure in figures.values():
        figure.savefig(io.BytesIO(), format="png")  # drawing parses any mathtext
    labels = [ax.get_ylabel() for f in figures.values() for ax in f.axes]
    assert label in labels, labels


def grid_free_prediction(latitudes: list[float]) -> xr.Dataset:
    """A grid-free model trained on a box of 50-51 N, 0-2 E (its checkpoint's record) asked about ``latitudes``."""
    from gridtnp.inference import predict
    from tests.cli.test_cli_errors import hourly, station_module

    module = station_module()
    module.data_metadata = {"box": {"axes": ["latitude", "longitude"], "targets": ([50.2, 0.1], [50.9, 1.8]),
                                    "grid": ([50.0, 0.0], [51.0, 2.0])}}  # fmt: skip
    context = {"grid": hourly([1], True).isel(time=0), "stations": hourly([1], False).isel(time=0)}
    return predict(module, context, xr.Dataset(coords={"latitude": latitudes, "longitude": [1.0]}))


# (id, the target latitudes, the one warning's text, or None for none)
GRID_FREE: list[tuple[str, list[float], str | None]] = [
    ("grid-free predictions far outside the training box", [50.5, 70.0],
     "targets lie outside the box of the training data (latitude 50 to 51, longitude 0 to 2) by up to 19 along "
     "latitude: this model has no grid"),
    ("grid-free predictions inside the training box", [50.5, 51.05], None),
]  # fmt: skip


@pytest.mark.parametrize(("latitudes", "message"), [c[1:] for c in GRID_FREE], ids=[c[0] for c in GRID_FREE])
def test_a_grid_free_model_says_when_targets_leave_its_training_box(latitudes, message):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grid_free_prediction(latitudes)
    said = [str(w.message) for w in caught if "training data" in str(w.message)]
    assert said == [] if message is None else (len(said) == 1 and message in said[0]), said


#: The tables above, by name (counted in the suite's summary, ``tests/conftest.py``).
TABLES = ("ERRORS", "ANSWERS", "READERS", "API", "FIGURES", "GRID_FREE")
