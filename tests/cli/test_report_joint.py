"""``gridtnp report`` of a joint predictive (``lowrank_gaussian``): samples from the model's own predictive in
kelvin, the regional mean's predictive as the coverage metric computes it, the sample maps and histograms, and the
page's section (rendered in headless Chromium where it can start)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from gridtnp.cli import main
from tests.cli.test_report import ONE_DAY, ROOT, screenshot_shows_the_page, two_step_fit

RECIPE = str(ROOT / "recipes" / "era5_swin_joint.yaml")
#: The joint recipe made tiny: the checkpoint only has to give a low-rank predictive.
TINY = ["--model.init_args.dim", "16", "--model.init_args.processor.layers", "2",
        "--model.init_args.likelihood.rank", "4"]  # fmt: skip


@pytest.fixture(scope="module")
def joint_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-step, tiny ``era5_swin_joint`` checkpoint on the embedded sample (prepared into a temporary cache), its
    variance calibration fitted on four validation hours."""
    yield from two_step_fit(tmp_path_factory.mktemp("era5_joint_report"), RECIPE, *TINY)


@pytest.fixture(scope="module")
def loaded(joint_checkpoint: Path):
    """The checkpoint loaded as ``gridtnp report`` loads it, and two test hours as one batch."""
    from gridtnp.cli.evaluate import load_checkpoint
    from gridtnp.report.compare import impact_batch

    cli = load_checkpoint([str(joint_checkpoint.with_name("config.yaml"))], joint_checkpoint, ONE_DAY)
    cli.model.eval()
    cli.datamodule.setup("test")
    return cli.model, cli.datamodule, impact_batch(cli.datamodule, "test", 2)


def test_samples_come_from_the_model_s_own_predictive_in_kelvin(loaded) -> None:
    from gridtnp.joint_metrics import regional_mean
    from gridtnp.metrics import point_weights
    from gridtnp.report.joint_samples import draw_joint_samples

    module, datamodule, batch = loaded
    samples = draw_joint_samples(module, datamodule, batch, count=1000, seed=3)
    assert samples is not None and samples.units == "K" and samples.rank == 4
    assert samples.joint.shape == samples.independent.shape == (1000, 2, datamodule.task.num_stations)
    valid = samples.weight > 0
    assert valid.any(1).all() and 250 < np.nanmean(samples.joint[:, valid]) < 300
    # The regional mean's predictive, carried into kelvin, is the one the regional_mean_coverage_90 metric uses.
    with torch.no_grad():
        dist = module.calibrate(module(batch), batch)
    target = batch.target
    mean, std, observed = regional_mean(dist, target.y, point_weights(target.valid(), target.x, module.latitude_dim))
    scale = datamodule.task.station_std
    np.testing.assert_allclose(samples.regional_std(), std[:, 0].numpy() * scale, rtol=1e-3)
    departure = samples.regional(samples.observed) - samples.regional(samples.mean)
    np.testing.assert_allclose(departure, (observed - mean)[:, 0].numpy() * scale, rtol=1e-3, atol=1e-4)
    # The samples have that predictive's spread: per station, and of their regional mean (joint and independent).
    ratio = samples.joint.std(0)[valid] / samples.std[valid]
    assert abs(float(np.mean(ratio)) - 1) < 0.05
    np.testing.assert_allclose(samples.regional(samples.joint).std(0), samples.regional_std(), rtol=0.12)
    independent = samples.regional(samples.independent).std(0)
    np.testing.assert_allclose(independent, samples.regional_std(independent=True), rtol=0.12)
    assert 0 < samples.low_rank_share() < 1
    again = draw_joint_samples(module, datamodule, batch, count=1000, seed=3)
    other = draw_joint_samples(module, datamodule, batch, count=1000, seed=4)
    np.testing.assert_array_equal(again.joint, samples.joint)  # a fixed seed: the same report twice
    assert not np.array_equal(other.joint, samples.joint)


def test_sample_maps_share_one_scale_and_the_histograms_mark_the_truth(loaded) -> None:
    from gridtnp.report.joint_plots import joint_section, plot_regional_means, plot_sample_maps
    from gridtnp.report.joint_samples import draw_joint_samples

    module, datamodule, batch = loaded
    samples = draw_joint_samples(module, datamodule, batch, count=200)
    maps = plot_sample_maps(samples, hour=1)
    panels = [ax for ax in maps.axes if ax.get_label() != "<colorbar>"]
    assert len(panels) == 10
    titles = [ax.get_title() for ax in panels]
    assert titles[:5] == ["predictive mean", "joint sample 1", "joint sample 2", "joint sample 3",
                          "independent sample (marginals)"]  # fmt: skip
    assert titles[5] == "truth - mean"
    top = {ax.collections[0].get_clim() for ax in panels[:5]}
    bottom = {ax.collections[0].get_clim() for ax in panels[5:]}
    assert len(top) == 1 and len(bottom) == 1  # one colour scale a row
    low, high = bottom.pop()
    assert low == -high > -np.inf
    figure = plot_regional_means(samples)
    axes = [ax for ax in figure.axes if ax.get_visible()]
    assert len(axes) == 2
    observed = samples.regional(samples.observed)
    for ax, truth in zip(axes, observed, strict=True):
        marked = [line.get_xdata() for line in ax.get_lines() if line.get_label() == "truth"]
        assert len(marked) == 1 and np.allclose(marked[0], truth)
        assert ax.get_title().endswith(("inside the 90 % interval", "outside the 90 % interval"))
    assert joint_section(module, datamodule, "test", {}, 4, hours=0) == ""


@pytest.mark.slow  # the whole page with Chromium (about 40 s); the section's parts are tested above
def test_report_of_a_joint_checkpoint_shows_its_samples(joint_checkpoint: Path, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    main(["report", "--config", RECIPE, *TINY, "--ckpt_path", str(joint_checkpoint), "--out", str(page),
          "--sample_hours", "2", *ONE_DAY])  # fmt: skip
    text = page.read_text()
    section = text.split('id="joint-samples"')[1].split("<h2")[0]
    assert "rank 4" in section and "seed 0" in section and "2019-03-27 00:00 UTC" in section
    assert 'id="sample_maps"' in section and 'id="regional_means"' in section
    table = text.split('id="metrics"')[1].split("</table>")[0]
    row = re.search(r"<td>regional_mean_coverage_90</td><td>([0-9.]+)</td>", table)
    quoted = re.search(r"<strong>([0-9.]+)</strong>", section)
    assert row and quoted and abs(float(row.group(1)) - float(quoted.group(1))) <= 5e-4  # the metric table's number
    assert text.count("data:image/png;base64,") == 6 + 2  # the report's figures, sample maps, regional means
    screenshot_shows_the_page(page, tmp_path)
