"""Station observations: the long format's checks (one line per bad row), the join to a store's hours, the split
by station and the ``era5_observations`` DataModule on the embedded sample."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from gridtnp.data.layout import DataError
from gridtnp.data.observations.datamodule import ObservationDataModule
from gridtnp.data.observations.join import observations_to_hours
from gridtnp.data.observations.table import read_observations
from gridtnp.data.observations.tasks import held_out_stations

HOURS = pd.date_range("2019-03-01T00:00", periods=6, freq="h")  # the store's time axis, by hand
LAT, LON = np.arange(50.0, 54.01, 0.25), np.arange(-4.0, 0.01, 0.25)
COLUMNS = ["station_id", "time", "latitude", "longitude", "t2m", "t2m_flag"]


def write(tmp_path: Path, rows: list[list[object]], name: str = "obs.csv") -> Path:
    path = tmp_path / name
    pd.DataFrame(rows, columns=COLUMNS).to_csv(path, index=False)
    return path


def test_each_bad_row_gets_one_line_naming_the_row_and_column(tmp_path: Path) -> None:
    rows = [
        ["A", "2019-03-01T00:00Z", 51.0, -1.0, 280.0, 0],  # line 2
        ["A", "2019-03-01T01:00Z", 51.0, -1.0, 281.0, ""],  # line 3
        ["Q", "2019-03-01T01:00Z", 52.0, -2.0, 279.0, 0],  # line 4: unknown station
        ["A", "2019-03-01T01:00Z", 51.0, -1.0, 281.5, 0],  # line 5: duplicate report, other value
        ["B", "2019-04-02T00:00Z", 52.0, -2.0, 278.0, 0],  # line 6: time outside the store
        ["B", "2019-03-01T02:00Z", 52.0, -2.0, 300.0, 3],  # line 7: flagged value
        ["B", "2019-03-01T03:00Z", 52.0, -2.0, "warm", 0],  # line 8: text in a number column
        ["B", "2019-03-01T04:00Z", 52.0, -2.0, 277.0, 0],  # line 9
        ["B", "2019-03-01T04:00Z", 52.0, -2.0, 277.0, 0],  # line 10: identical duplicate, merged silently
    ]
    table, problems = read_observations(write(tmp_path, rows), ["t2m"], station_ids=["A", "B"])
    hourly, joined = observations_to_hours(table, HOURS, LAT, LON, ["t2m"], "30min", "obs.csv")
    lines = {p.line: p for p in problems + joined}
    assert sorted(lines) == [4, 5, 6, 7, 8] and len(problems + joined) == 5  # one line per bad row
    assert (lines[4].column, lines[4].fatal) == ("station_id", True) and "unknown station 'Q'" in lines[4].message
    assert lines[5].column == "t2m" and "duplicate report of 'A'" in lines[5].message and "line 3" in lines[5].message
    assert lines[6].column == "time" and "time outside the store" in lines[6].message and not lines[6].fatal
    assert lines[7].column == "t2m_flag" and "flagged value dropped" in lines[7].message and not lines[7].fatal
    assert lines[8].column == "t2m" and "'warm' is not a number" in lines[8].message and lines[8].fatal
    assert all(str(p).startswith(f"obs.csv: line {p.line}, column {p.column}: ") for p in problems + joined)
    # What is left: A at 00 and 01, B at 02 (flagged: no value) and 04 (once).
    assert list(hourly.stations["station_id"]) == ["A", "B"]
    expected = np.full((6, 2), np.nan)
    expected[0, 0], expected[1, 0], expected[4, 1] = 280.0, 281.0, 277.0
    np.testing.assert_array_equal(hourly.at_hours(np.arange(6))[..., 0], expected)


def test_a_station_with_two_locations_is_refused_with_one_line(tmp_path: Path) -> None:
    rows = [["A", "2019-03-01T00:00Z", 51.0, -1.0, 280.0, 0], ["A", "2019-03-01T01:00Z", 51.5, -1.0, 281.0, 0]]
    table, problems = read_observations(write(tmp_path, rows))
    assert len(problems) == 1 and problems[0].line == 3 and "two locations" in problems[0].message
    assert table.empty


def test_the_join_takes_the_nearest_hour_within_the_tolerance(tmp_path: Path) -> None:
    rows = [
        ["A", "2019-03-01T00:00Z", 51.0, -1.0, 280.0, 0],  # hour 0
        ["A", "2019-03-01T00:50Z", 51.0, -1.0, 281.0, 0],  # 10 min before hour 1: beaten by the next report
        ["A", "2019-03-01T01:05Z", 51.0, -1.0, 282.0, 0],  # 5 min after hour 1: kept
        ["A", "2019-03-01T02:20Z", 51.0, -1.0, 283.0, 0],  # 20 min from hour 2: between hours, dropped
        ["B", "2019-03-01T03:10+00:00", 52.0, -2.0, 270.0, 0],  # hour 3
        ["B", "2019-03-01T05:10+01:00", 52.0, -2.0, 271.0, 0],  # 04:10 UTC: hour 4
        ["C", "2019-03-01T01:00Z", 59.0, -2.0, 260.0, 0],  # outside the box
    ]
    table, problems = read_observations(write(tmp_path, rows))
    hourly, joined = observations_to_hours(table, HOURS, LAT, LON, ["t2m"], "15min", "obs.csv")
    assert problems == []
    assert [(p.line, p.column) for p in joined] == [(5, "time"), (None, "latitude, longitude")]
    assert "between hours" in joined[0].message and "C (59, -2)" in joined[1].message
    values = hourly.at_hours(np.arange(6))[..., 0]
    expected = np.full((6, 2), np.nan)
    expected[[0, 1], 0] = [280.0, 282.0]
    expected[[3, 4], 1] = [270.0, 271.0]
    np.testing.assert_array_equal(values, expected)
    np.testing.assert_array_equal(hourly.mask[..., 0], np.isfinite(hourly.values[..., 0]))
    assert list(hourly.hours) == [0, 1, 3, 4] and hourly.merged == 1
    # Half-way between two hours with a 30 minute tolerance: the earlier hour.
    half, _ = observations_to_hours(table.iloc[[0]].assign(time=HOURS[2] + pd.Timedelta("30min")), HOURS, LAT, LON,
                                    ["t2m"], "30min")  # fmt: skip
    assert list(half.hours) == [2]


def test_parquet_without_pyarrow_names_the_package(tmp_path: Path) -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        path = tmp_path / "obs.parquet"
        path.write_bytes(b"PAR1")
        with pytest.raises(DataError, match="pyarrow"):
            read_observations(path)
    else:
        pytest.skip("pyarrow is installed")


def test_held_out_stations_are_fixed_by_identifier() -> None:
    ids = [f"S{i:04d}" for i in range(2000)]
    held = held_out_stations(ids, 0.2, seed=0)
    assert 0.17 < held.mean() < 0.23
    # The same station is held out whichever other stations are listed; another seed gives another split.
    np.testing.assert_array_equal(held_out_stations(ids[::7], 0.2, seed=0), held[::7])
    assert (held_out_stations(ids, 0.2, seed=1) != held).any()


@pytest.fixture(scope="module")
def sample() -> ObservationDataModule:
    dm = ObservationDataModule(loader={"batch_size": 4, "train_batches": 2})
    with pytest.warns(UserWarning, match="flagged value dropped"):
        dm.setup()
    return dm


def test_the_sample_datamodule_splits_stations_and_masks_missing_reports(sample: ObservationDataModule) -> None:
    task = sample.task
    held_x = {tuple(x) for x in task.station_x[~task.observed]}
    assert 0 < len(held_x) < len(task.station_x)
    batch = sample.split_task("train").sample(4, torch.Generator().manual_seed(0))
    grid, stations = batch.context["grid"], batch.context["stations"]
    assert grid.x.shape[:2] == grid.y.shape[:2] and grid.y.shape[-1] == 1 and bool(grid.mask.all())
    assert stations.x.shape[-1] == 2 and stations.y.shape[-1] == 1 and batch.target.y.shape[-1] == 1
    for obs in (stations, batch.target):  # held-out stations never appear in training
        assert not {tuple(x) for x in obs.x[obs.mask].numpy()} & held_x
    assert batch.extras["coarse_sq_err"].shape == batch.target.mask.shape
    assert not bool(batch.extras["is_context"].any())  # targets: held_out

    test = sample.eval_dataset("test")
    assert len(test) == -(-len(sample.splits["test"].target_time) // 4)  # every test hour once
    batch = test[0]
    stations, target = batch.context["stations"], batch.target
    assert {tuple(x) for x in target.x[target.mask].numpy()} <= held_x
    assert not {tuple(x) for x in stations.x[stations.mask].numpy()} & held_x
    # Context: every observed station that reported in the hour; a missing report is masked, never zero-filled in.
    hours = batch.extras["hour"].numpy()
    reported = np.isfinite(task.values[task.rows[hours]])  # [B, S]
    assert stations.mask.sum(1).tolist() == (reported & task.observed).sum(1).tolist()
    assert target.mask.sum(1).tolist() == (reported & ~task.observed).sum(1).tolist()
    assert bool((stations.y[~stations.mask] == 0).all()) and bool(torch.isfinite(target.y).all())


def test_a_bad_row_in_the_datamodules_file_is_refused(tmp_path: Path) -> None:
    rows = [["A", "2019-03-01T00:00Z", 51.0, -1.0, "n/a?", 0], ["B", "2019-03-01T00:00Z", 52.0, -1.0, 280.0, 0]]
    dm = ObservationDataModule(observations={"path": str(write(tmp_path, rows))})
    with pytest.raises(DataError, match=r"obs.csv: line 2, column t2m: 'n/a\?' is not a number"):
        dm.setup()
