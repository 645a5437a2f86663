"""Plots: figures are drawn and written, the true 1-D GP posterior, TensorBoard images and ``gridtnp plot``."""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
import yaml
from torch.distributions import Normal

from gridtnp import NeuralProcessModule
from gridtnp.batch import Batch, Observations
from gridtnp.cli import main
from gridtnp.data import SyntheticDataModule
from gridtnp.data.sections import from_flat_arguments
from gridtnp.registry import build_from_spec
from gridtnp.report.calibration_plots import plot_standardised_errors
from gridtnp.report.map_axes import compact_longitudes
from gridtnp.report.plots import PlotCallback, evaluation_figures, plot_map, regular_grid

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG"


def save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=50)
    assert path.read_bytes()[:4] == PNG
    return path


def test_true_gp_posterior_reproduces_the_oracle_loglik() -> None:
    task = build_from_spec("task", {"name": "gp1d"})
    batch = task.sample(4, torch.Generator().manual_seed(3))
    mean, std = task.posterior(batch, batch.target.x)
    loglik = Normal(mean, std).log_prob(batch.target.y[..., 0]).mean(-1)
    torch.testing.assert_close(loglik, batch.extras["oracle_loglik"], atol=2e-3, rtol=0)


def test_gp1d_figures_with_the_true_posterior(tmp_path: Path) -> None:
    task = build_from_spec("task", {"name": "gp1d"})
    batch = task.sample(3, torch.Generator().manual_seed(0))
    model = NeuralProcessModule(preset="cnp", dim=16).model
    figures = evaluation_figures(model, batch, num_tasks=2, posterior=task.posterior)
    assert set(figures) == {"standardised_errors", "task000", "task001"}
    labels = [line.get_label() for line in figures["task000"].axes[0].get_lines()]
    assert "true GP posterior" in labels and "model mean" in labels
    for name, fig in figures.items():
        save(fig, tmp_path / f"{name}.png")


def test_regular_grid_detection() -> None:
    lat, lon = np.meshgrid(np.arange(3.0), np.arange(4.0), indexing="ij")
    x = np.stack([lat.ravel(), lon.ravel()], -1)[::-1]  # any order
    rows, cols, flat = regular_grid(x)
    assert len(rows) == 3 and len(cols) == 4
    np.testing.assert_array_equal(rows[flat // 4], x[:, 0])
    np.testing.assert_array_equal(cols[flat % 4], x[:, 1])
    assert regular_grid(x[:-1]) is None
    assert regular_grid(np.random.default_rng(0).random((12, 2))) is None


def test_maps_for_gridded_and_scattered_targets(tmp_path: Path) -> None:
    b = 2
    lat, lon = torch.meshgrid(torch.linspace(50, 58, 9), torch.linspace(-10, 2, 13), indexing="ij")
    grid_x = torch.stack([lat.flatten(), lon.flatten()], -1).expand(b, -1, -1)
    stations = torch.rand(b, 30, 2) * torch.tensor([8.0, 12.0]) + torch.tensor([50.0, -10.0])
    context = {
        "grid": Observations(grid_x, torch.randn(b, 117, 1)),
        "stations": Observations(stations[:, :10], torch.randn(b, 10, 1)),
    }
    for name, xt in (("scattered", stations[:, 10:]), ("gridded", grid_x)):
        target = Observations(xt, torch.randn(b, xt.shape[1], 1))
        batch = Batch(context, target)
        mean, std = torch.randn_like(target.y), torch.rand_like(target.y) + 0.1
        fig = plot_map(batch, mean, std, index=1, geographic=True)
        titles = [ax.get_title() for ax in fig.axes]
        assert "predictive std" in titles and "standardised error (mean - truth) / std" in titles
        assert "context 'stations' (10 points)" in titles
        save(fig, tmp_path / f"{name}.png")
    fig = plot_standardised_errors(torch.randn(1000))
    assert "N(0, 1)" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    save(fig, tmp_path / "hist.png")


def test_global_maps_have_two_wide_panels_a_row_and_small_markers() -> None:
    """Thousands of stations over the globe: two panels a row (three for a regional map) and markers that shrink
    with the number of points."""
    g = torch.Generator().manual_seed(0)

    def task(n: int, lat: tuple[float, float], lon: tuple[float, float]) -> tuple[Batch, torch.Tensor]:
        x = torch.rand(1, n, 2, generator=g) * torch.tensor([lat[1] - lat[0], lon[1] - lon[0]])
        x = x + torch.tensor([lat[0], lon[0]])
        target = Observations(x, torch.randn(1, n, 1, generator=g))
        return Batch({"stations": Observations(x[:, :50], target.y[:, :50])}, target), target.y

    def columns(fig) -> int:
        maps = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
        return len({ax.get_subplotspec().colspan.start for ax in maps})

    world, y = task(8000, (-60.0, 80.0), (-180.0, 180.0))
    fig = plot_map(world, y, torch.ones_like(y), geographic=True)
    assert columns(fig) == 2
    sizes = fig.axes[0].collections[0].get_sizes()
    region, y = task(200, (50.0, 58.0), (-10.0, 2.0))
    fig = plot_map(region, y, torch.ones_like(y), geographic=True)
    assert columns(fig) == 3
    assert sizes.max() < fig.axes[0].collections[0].get_sizes().min() / 5


def test_plot_callback_logs_tensorboard_images(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = from_flat_arguments(SyntheticDataModule, task={"name": "gp1d"}, batch_size=4, train_batches=2, val_batches=1)
    trainer = L.Trainer(
        max_steps=2,
        accelerator="cpu",
        logger=L.pytorch.loggers.TensorBoardLogger(tmp_path),
        callbacks=[PlotCallback(every_n_validations=1, num_tasks=1)],
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(NeuralProcessModule(preset="cnp", dim=16), data)
    events = EventAccumulator(str(next(tmp_path.rglob("events.out.tfevents*")).parent))
    events.Reload()
    assert {"val_plots/task000", "val_plots/standardised_errors"} <= set(events.Tags()["images"])


def test_gridtnp_plot_writes_pngs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    recipe = ROOT / "recipes" / "gp1d_cnp.yaml"
    module = NeuralProcessModule(**yaml.safe_load(recipe.read_text())["model"]["init_args"])
    ckpt = tmp_path / "model.ckpt"
    torch.save({"state_dict": module.state_dict(), "global_step": 0}, ckpt)  # as a training checkpoint
    out = tmp_path / "plots"
    args = ["plot", "--config", str(recipe), "--ckpt_path", str(ckpt), "--out", str(out), "--num_tasks", "3"]
    main([*args, "--data.init_args.loader.test_batches", "2", "--data.init_args.loader.batch_size", "2"])
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "test_reliability.png", "test_standardised_errors.png", "test_task000.png", "test_task001.png",
        "test_task002.png",
    ]  # fmt: skip
    assert all((out / n).read_bytes()[:4] == PNG for n in names)
    assert "5 files" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["plot", "--config", str(recipe), "--ckpt_path", str(tmp_path / "nope.ckpt"), "--out", str(out)])


def test_reliability_diagram_coverage_of_calibrated_and_over_confident_errors(tmp_path: Path) -> None:
    from gridtnp.report.calibration_plots import RELIABILITY_LEVELS, interval_coverage, plot_reliability

    z = torch.randn(200_000, generator=torch.Generator().manual_seed(0))
    np.testing.assert_allclose(interval_coverage(z), RELIABILITY_LEVELS, atol=0.005)  # on the diagonal
    wide = interval_coverage(2.0 * z)  # std half the truth's: every interval covers less than it says
    assert all(w < level - 0.03 for w, level in zip(wide, RELIABILITY_LEVELS, strict=True) if level < 0.99)
    expected_90 = math.erf(1.6448536 / 2 / math.sqrt(2))  # P(|z| < 1.645 / 2) = 0.589
    assert wide[RELIABILITY_LEVELS.index(0.9)] == pytest.approx(expected_90, abs=0.005)
    fig = plot_reliability({"calibrated": z, "over-confident": 2.0 * z})
    fig.savefig(tmp_path / "reliability.png")
    assert (tmp_path / "reliability.png").read_bytes()[:4] == PNG


def test_maps_across_the_date_line_are_one_piece_and_others_keep_their_longitudes() -> None:
    pacific = np.array([[-20.0, 150.0], [-15.0, 178.0], [-14.0, -172.0], [-18.0, -178.5]])
    grid = np.array([[-20.0, 140.0], [0.0, 200.0]])  # a context read past 180 degrees
    out = compact_longitudes([pacific, grid])
    assert out[0][:, 1].tolist() == [150.0, 178.0, 188.0, 181.5] and out[1][:, 1].tolist() == [140.0, 200.0]
    np.testing.assert_array_equal(out[0][:, 0], pacific[:, 0])
    world = np.array([[0.0, -170.0], [10.0, -60.0], [50.0, 0.0], [30.0, 100.0], [-30.0, 170.0]])
    uk = np.array([[50.0, -10.0], [58.0, 2.0]])
    for kept in (world, uk):
        np.testing.assert_array_equal(compact_longitudes([kept])[0], kept)
