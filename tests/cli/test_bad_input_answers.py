"""Bad inputs that gave a wrong answer without a word, or buried their cause under a traceback or a misleading line.

Each row of ``ERRORS`` is one ``gridtnp: error:`` line naming the cause and the fix (exit status 2, the guarded path
unchanged), as in ``tests/cli/test_cli_errors.py``; each row of ``ANSWERS`` runs to the right result with the one
``gridtnp: warning:`` line that says what was done (or none); each row of ``READERS`` is one ``DataError`` line
from a reader of the project's tables.
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


# (id, arguments given the test's folder, the one warning line's text or None for no warning, the check of the result)
ANSWERS: list[tuple[str, Callable[[Path], list[str]], str | None, Callable[[Path], None]]] = [
    (
        "one undeclared fill value (3e38) in a prepare input",
        lambda t: ["data", "prepare", str(fill_value_file(t / "a.nc")), "--out", str(t / "s.zarr"), "--quiet"],
        "t2m: 1 value(s) beyond +-1e30 or infinite (a fill value the input does not declare",
        fill_value_stats,
    ),
    (
        "an infinite value in a prepare input",
        lambda t: ["data", "prepare", str(fill_value_file(t / "a.nc", np.inf)), "--out", str(t / "s.zarr"), "--quiet"],
        "are stored as missing (NaN), outside the statistics",
        fill_value_stats,
    ),
    (
        "a regional NetCDF across the date line with a --region across it",
        lambda t: [
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
    ),
]


@pytest.mark.parametrize(("arrange", "warning", "check"), [c[1:] for c in ANSWERS], ids=[c[0] for c in ANSWERS])
def test_the_answer_is_right_and_said(arrange, warning, check, tmp_path, capsys):
    main(arrange(tmp_path))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("gridtnp: warning:")]
    if warning is None:
        assert lines == []
    else:
        assert len(lines) == 1 and warning in lines[0], lines
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
