"""Forecast tasks of ``StationReanalysisDataModule`` (``task.context_hours``, ``task.lead_hours``): context hours,
lead hours, splits, the predictions' coordinates, and a short fit through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from gridtnp.cli import GridTNPCLI
from gridtnp.data.era5.station_options import StationTaskConfig
from gridtnp.data.store import coarsen_fields
from gridtnp.registry import ConfigError
from tests.data.test_era5 import NUM_INSIDE, datamodule, expected_t2m, field, unnormalise

ROOT = Path(__file__).resolve().parents[2]
FORECAST = {"context_hours": (-2, 0), "lead_hours": (1, 3, 6)}


def fit_two_steps_then_test(common: list[str], ckpt: Path) -> dict[str, float]:
    """``gridtnp fit`` for two steps and ``gridtnp test`` of its last checkpoint in ``ckpt`` with the CLI arguments
    ``common``; the test metrics."""
    fit = ["--trainer.max_steps", "2", "--trainer.limit_val_batches", "1", "--trainer.val_check_interval", "2"]
    GridTNPCLI(args=["fit", *common, *fit, "--plots.every_n_validations", "0"])
    GridTNPCLI(args=["test", *common, "--ckpt_path", str(ckpt / "last.ckpt")])
    return json.loads((ckpt / "last.test_metrics.json").read_text())["metrics"]


def test_the_same_hour_task_is_the_default(store: str, stations: str) -> None:
    assert not StationTaskConfig().forecast
    dm = datamodule(store, stations)
    batch = next(iter(dm.train_dataloader()))
    assert dm.dim_x == 2 and not dm.lead_hours
    assert all(o.x.shape[-1] == 2 for o in (*batch.context.values(), batch.target))
    assert "lead_hours" not in batch.extras
    assert batch.target.x.shape[1] == NUM_INSIDE


def test_context_hours_up_to_t_and_targets_at_each_lead(store: str, stations: str) -> None:
    dm = datamodule(store, stations, context_fraction=(0.3, 0.6), coarsen_offset=(0, 0), **FORECAST)
    assert dm.dim_x == 3 and dm.lead_hours == [1, 3, 6]
    batch = next(iter(dm.train_dataloader()))
    hour = batch.extras["hour"].numpy()[:, None]  # the initial hour t (store index; the store is hourly)
    stations_c, target = batch.context["stations"], batch.target
    # Every context station at t-2, t-1 and t, each with its hours from t, its value that hour's.
    c_hours = stations_c.x[..., 0].numpy()
    assert set(np.unique(c_hours[stations_c.mask.numpy()])) == {-2.0, -1.0, 0.0}
    for obs, hours in ((stations_c, c_hours), (target, target.x[..., 0].numpy())):
        x, m = obs.x.numpy(), obs.mask.numpy()
        want = expected_t2m(x[..., 1], x[..., 2], hour + hours)
        np.testing.assert_allclose(unnormalise(dm, obs.y[..., 0])[m], want[m], atol=1e-3)
    # Targets: every station at t+1, t+3 and t+6, lead-major; their leads in extras.
    assert target.x.shape[1] == 3 * NUM_INSIDE and bool(target.mask.all())
    np.testing.assert_array_equal(target.x[0, :, 0].numpy(), np.repeat([1.0, 3.0, 6.0], NUM_INSIDE))
    assert torch.equal(batch.extras["lead_hours"], target.x[..., 0])
    # The grid is at t, with hours 0.
    grid = batch.context["grid"]
    assert bool((grid.x[..., 0] == 0).all())
    full = field().t2m.values[hour[:, 0]]
    np.testing.assert_allclose(unnormalise(dm, grid.y[..., 0]), coarsen_fields(full, 4).reshape(4, 9), atol=1e-3)


def test_every_context_and_target_hour_stays_in_its_split(store: str, stations: str) -> None:
    dm = datamodule(store, stations, **FORECAST)
    for split in dm.splits.values():
        inside = np.isin(split.offset_time, split.hours)
        assert inside.all() and len(split.target_time) == len(split.hours) - 2 - 6  # 2 h before, 6 h after
        np.testing.assert_array_equal(split.offset_time[:, 2], split.target_time)  # offset 0: the initial hour
    assert dm.splits["train"].offset_time.max() < dm.splits["val"].hours.min()
    val = dm.val_dataloader()
    hours = torch.cat([b.extras["hour"] for b in val]).numpy()
    np.testing.assert_array_equal(hours, dm.splits["val"].target_time)


def test_forecast_hours_are_checked() -> None:
    for bad in ({"context_hours": [0, -2]}, {"context_hours": [-1, 1]}, {"lead_hours": [3, 1]}, {"lead_hours": []}):
        with pytest.raises(ConfigError, match=r"task\.(context|lead)_hours"):
            StationTaskConfig(**bad)
    assert StationTaskConfig(lead_hours=[1]).context_hours == (0, 0)
    assert StationTaskConfig(context_hours=[-3, 0]).lead_hours == (0,)
    with pytest.raises(ConfigError, match="num_targets"):
        StationTaskConfig(lead_hours=[1], num_targets=3)


def test_predictions_carry_init_time_and_lead_time(store: str, stations: str) -> None:
    dm = datamodule(store, stations, climatology=True, **FORECAST)
    outputs = []
    for batch in dm.val_dataloader():  # a perfect forecast: the observed departures themselves
        target = batch.target
        outputs.append({"mean": target.y, "std": torch.ones_like(target.y), "x": target.x, "y": target.y,
                        "mask": target.mask, **batch.extras})  # fmt: skip
    ds = dm.predictions_to_xarray(outputs)
    assert ds["t2m" if "t2m" in ds else "mean"].dims == ("init_time", "lead_time", "station")
    assert ds["init_time"].attrs["standard_name"] == "forecast_reference_time"
    assert ds["lead_time"].attrs["standard_name"] == "forecast_period"
    np.testing.assert_array_equal(ds["lead_time"].values, np.array([1, 3, 6], "timedelta64[h]"))
    valid = ds["init_time"].values[:, None] + ds["lead_time"].values[None]
    np.testing.assert_array_equal(ds["time"].values, valid)
    # The values are the store's at each valid hour (the climatology added back).
    hours = (valid - np.datetime64("2020-01-01T00")) / np.timedelta64(1, "h")
    want = expected_t2m(ds["latitude"].values[None, None], ds["longitude"].values[None, None], hours[..., None])
    np.testing.assert_allclose(ds["mean"].values, want, atol=2e-3)


def test_a_forecast_recipe_fits_and_tests_through_the_cli(tmp_path: Path, store: str, stations: str) -> None:
    recipe = str(ROOT / "recipes" / "era5_swin_leads.yaml")
    common = [
        "--config", recipe, "--data.init_args.store.path", store, "--data.init_args.stations", stations,
        "--data.init_args.splits.train", "[2020-01-01, 2020-01-02]", "--data.init_args.splits.val",
        "[2020-01-03, 2020-01-03]", "--data.init_args.splits.test", "[2020-01-04, 2020-01-04]",
        "--model.init_args.grid", "{lower: [50.0, -1.0], upper: [52.0, 1.0], shape: [4, 4]}",
        "--trainer.default_root_dir", str(tmp_path), "--checkpoint.dirpath", str(tmp_path / "ckpt"),
        "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
    ]  # fmt: skip
    metrics = fit_two_steps_then_test(common, tmp_path / "ckpt")
    for lead in (1, 3, 6):  # every metric per lead, e.g. test/lead_6h/rmse_physical
        assert np.isfinite(metrics[f"lead_{lead}h/rmse_physical"]) and np.isfinite(metrics[f"lead_{lead}h/loglik"])
