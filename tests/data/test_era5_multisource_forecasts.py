"""Forecast tasks of ``MultiSourceDataModule`` (``task.context_hours``, ``task.lead_hours``): context and target
hours, splits, the ``lead_hours`` extra, predictions on ``(init_time, lead_time, ...)`` and a short fit and test
through the CLI; the window task unchanged when the options are unset."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr

from gridtnp.batch import Batch
from gridtnp.cli import GridTNPCLI
from gridtnp.data import MultiSourceDataModule
from gridtnp.data.era5.sources import MultiSourceTaskConfig
from gridtnp.data.layout import DataError
from gridtnp.registry import ConfigError
from tests.data.test_era5_forecasts import fit_two_steps_then_test
from tests.data.test_era5_multisource import DATES, LAT, LON, make_store, physical, u_field
from tests.data.test_era5_multisource import datamodule as window_datamodule

ROOT = Path(__file__).resolve().parents[2]
FORECAST = {"context_hours": (-2, 0), "lead_hours": (1, 3, 6)}
POINTS = len(LAT) * len(LON)  # per hour


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_store(tmp_path_factory.mktemp("multisource_forecasts"))


def datamodule(store: str, batch_size: int = 4, **task: object) -> MultiSourceDataModule:
    """The test file's sources and dates with the task options ``task``, set up."""
    splits = {name.removesuffix("_dates"): list(dates) for name, dates in DATES.items()}
    loader = {"batch_size": batch_size, "train_batches": 3, "val_batches": 2, "test_batches": 2}
    sources = {"variables": ["u@850", "v@850", "u@500", "u10"], "target_variables": ["u@850", "v@850"]}
    dm = MultiSourceDataModule(store={"path": store}, splits=splits, loader=loader, task={**sources, **task})
    dm.setup()
    return dm


def digest(batches: list[Batch]) -> str:
    """The first 16 hex digits of a SHA-256 over every tensor of ``batches``, in a fixed order."""
    h = hashlib.sha256()
    for batch in batches:
        for _, obs in sorted({**batch.context, "target": batch.target}.items()):
            for tensor in (obs.x, obs.y, obs.mask):
                h.update(tensor.contiguous().numpy().tobytes())
        for key in sorted(batch.extras):
            h.update(key.encode())
            h.update(batch.extras[key].contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def test_window_tasks_are_unchanged_without_the_options(store: str) -> None:
    dm = window_datamodule(store)
    assert not dm.options.forecast and dm.lead_hours == []
    train = [dm.split_task("train").sample(4, torch.Generator().manual_seed(seed)) for seed in (0, 1)]
    assert "lead_hours" not in train[0].extras
    # Digests of the window task's batches before forecast tasks existed: the same draws, bit for bit.
    assert digest(train) == "6cc9099e4cf3c64b"
    assert digest([next(iter(dm.predict_dataloader()))]) == "0ac10e51c2459927"


def test_contexts_at_the_context_hours_and_targets_at_each_lead(store: str) -> None:
    dm = datamodule(store, **FORECAST, context_fraction=(0.1, 0.2), target_fraction=0.25)
    assert dm.dim_x == 3 and dm.lead_hours == [1, 3, 6]
    batch = dm.split_task("train").sample(6, torch.Generator().manual_seed(2))
    t = batch.extras["start_hour"].numpy()[:, None]
    for name, level in [("u850", 850.0), ("u500", 500.0)]:
        obs = batch.context[name]
        x, m = obs.x.numpy(), obs.mask.numpy()
        assert set(np.unique(x[m][:, 0])) == {-2.0, -1.0, 0.0}, name
        counts = m.sum(1)
        assert (counts >= int(0.1 * 3 * POINTS)).all() and (counts <= int(0.2 * 3 * POINTS)).all(), name
        expected = u_field(level, t + x[..., 0], x[..., 1], x[..., 2])
        np.testing.assert_allclose(physical(dm, obs.y[..., 0], "u", level)[m], expected[m], atol=1e-3)
    target = batch.target
    x = target.x.numpy()
    assert target.x.shape[1] == round(0.25 * 3 * POINTS) and target.mask.all()
    assert set(np.unique(x[..., 0])) == {1.0, 3.0, 6.0}
    u = u_field(850.0, t + x[..., 0], x[..., 1], x[..., 2])
    np.testing.assert_allclose(physical(dm, target.y[..., 0], "u", 850.0), u, atol=1e-3)
    assert torch.equal(batch.extras["lead_hours"], target.x[..., 0])


def test_a_lead_at_the_initial_hour_never_shows_its_targets_in_the_context(store: str) -> None:
    dm = datamodule(store, context_hours=[-1, 0], lead_hours=[0, 2], context_fraction=(0.9, 1.0))
    batch = dm.split_task("train").sample(6, torch.Generator().manual_seed(3))
    key = lambda x: set(map(tuple, x.tolist()))  # noqa: E731
    for b in range(6):
        targets = key(batch.target.x[b])
        assert {h for h, *_ in targets} == {0.0, 2.0}
        for name in ("u850", "v850"):  # target variables: the targets at hour 0 are left out of the context
            obs = batch.context[name]
            shown = key(obs.x[b][obs.mask[b]])
            assert not targets & shown and len(shown) <= 2 * POINTS - sum(h == 0.0 for h, *_ in targets), name
        assert targets & key(batch.context["u10"].x[b][batch.context["u10"].mask[b]])  # others may show them


def test_every_context_and_lead_hour_lies_inside_the_split(store: str) -> None:
    dm = datamodule(store, **FORECAST)
    time = pd.date_range("2020-01-01", periods=72, freq="h")
    for split, (start, end) in zip(("train", "val", "test"), DATES.values(), strict=True):
        init = time[dm.starts[split]]
        assert init.min() - pd.Timedelta(hours=2) == pd.Timestamp(start)
        assert init.max() + pd.Timedelta(hours=6) == pd.Timestamp(end) + pd.Timedelta(hours=23)
        assert len(init) == 24 - 2 - 6
    assert dm.describe() == (
        "4 sources (u850, v850, u500, u10) on 7 x 9 grid points, context hours -2 to 0, lead hours 1, 3, 6; targets "
        "u850, v850; initial hours: train 16, val 16, test 16"
    )
    with pytest.raises(DataError, match=r"no initial hour has every context hour .* widen its dates"):
        datamodule(store, context_hours=[-2, 0], lead_hours=[30])


def test_bad_hours_name_the_option() -> None:
    for bad in ({"context_hours": [0, -2]}, {"context_hours": [-1, 1]}, {"lead_hours": [3, 1]}, {"lead_hours": []}):
        with pytest.raises(ConfigError, match=r"task\.(context|lead)_hours"):
            MultiSourceTaskConfig(**bad)
    assert MultiSourceTaskConfig(lead_hours=[1]).context_hours == (0, 0)
    assert MultiSourceTaskConfig(context_hours=[-3, 0]).lead_hours == (0,)


def test_predictions_carry_init_time_and_lead_time(store: str) -> None:
    dm = datamodule(store, **FORECAST, batch_size=5)
    loader = dm.predict_dataloader()
    assert len(loader.dataset.starts) == 16  # every initial hour of the test day
    outputs = []
    for batch in loader:  # a stand-in model: predicts the truth, std 1 (normalised units)
        assert batch.target.x.shape[1] == 3 * POINTS and batch.target.mask.all()
        outputs.append({"mean": batch.target.y, "std": torch.ones_like(batch.target.y), **batch.extras})
    ds = dm.predictions_to_xarray(outputs)
    assert ds["u850_mean"].dims == ("init_time", "lead_time", "latitude", "longitude")
    assert ds["init_time"].attrs["standard_name"] == "forecast_reference_time"
    assert ds["lead_time"].attrs["standard_name"] == "forecast_period"
    np.testing.assert_array_equal(ds["lead_time"].values, np.array([1, 3, 6], "timedelta64[h]"))
    assert str(ds.init_time.values[0])[:13] == "2020-01-03T02" and ds.sizes["init_time"] == 16
    valid = ds["init_time"].values[:, None] + ds["lead_time"].values[None]
    np.testing.assert_array_equal(ds["time"].values, valid)
    hours = (valid - np.datetime64("2020-01-01T00")) / np.timedelta64(1, "h")
    h, la, lo = np.meshgrid(hours.ravel(), LAT, LON, indexing="ij")
    want = u_field(850.0, h, la, lo).reshape(ds["u850_mean"].shape)
    np.testing.assert_allclose(ds["u850_mean"].values, want, atol=1e-3)
    np.testing.assert_allclose(ds["v850_mean"].values, -want, atol=1e-3)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_forecast_fits_tests_and_predicts_through_the_cli(tmp_path: Path, store: str) -> None:
    """Metrics per lead in ``gridtnp test``; ``gridtnp predict`` to Zarr a few tasks at a time (appended along
    init_time) equals the NetCDF file written at once."""
    recipe = str(ROOT / "recipes" / "era5_multisource_swin.yaml")
    common = [
        "--config", recipe, "--data.init_args.store.path", store,
        "--data.init_args.task.variables", "[u10]", "--model.init_args.dim_y", "{u10: 1}",
        "--model.init_args.target_source", "u10",
        "--data.init_args.task.context_hours", "[-1, 0]", "--data.init_args.task.lead_hours", "[1, 3]",
        "--data.init_args.splits.train", "[2020-01-01, 2020-01-01]", "--data.init_args.splits.val",
        "[2020-01-02, 2020-01-02]", "--data.init_args.splits.test", "[2020-01-03, 2020-01-03]",
        "--data.init_args.loader.batch_size", "2", "--data.init_args.loader.train_batches", "2",
        "--data.init_args.loader.val_batches", "1", "--data.init_args.loader.test_batches", "2",
        "--model.init_args.grid", "{lower: [-1.0, 50.0, -2.0], upper: [3.0, 53.0, 2.0], shape: [4, 4, 4]}",
        "--trainer.default_root_dir", str(tmp_path), "--checkpoint.dirpath", str(tmp_path / "ckpt"),
        "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
    ]  # fmt: skip
    metrics = fit_two_steps_then_test(common, tmp_path / "ckpt")
    for lead in (1, 3):  # every metric per lead, e.g. test/lead_3h/rmse_physical
        assert np.isfinite(metrics[f"lead_{lead}h/rmse_physical"]) and np.isfinite(metrics[f"lead_{lead}h/loglik"])
    predict = ["predict", *common, "--ckpt_path", str(tmp_path / "ckpt" / "last.ckpt")]
    GridTNPCLI(args=[*predict, "--predictions.path", str(tmp_path / "p.zarr"), "--predictions.tasks_per_write", "5"])
    GridTNPCLI(args=[*predict, "--predictions.path", str(tmp_path / "p.nc")])
    streamed, once = xr.open_zarr(tmp_path / "p.zarr").load(), xr.open_dataset(tmp_path / "p.nc").load()
    xr.testing.assert_identical(streamed, once)
    assert streamed["u10"].dims == ("init_time", "lead_time", "latitude", "longitude")
    assert streamed.sizes["init_time"] == 24 - 1 - 3 and np.isfinite(streamed["u10"].values).all()
