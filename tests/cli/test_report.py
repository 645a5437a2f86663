"""Maps in physical units with coastlines, calibration by kind of target, per-station figures, ``gridtnp report``'s
HTML page (rendered in headless Chromium where it can start)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure

from gridtnp.cli import GridTNPCLI, main
from gridtnp.data.sections import from_flat_arguments
from gridtnp.report.coastlines import coastline_segments, draw_coastlines

ROOT = Path(__file__).resolve().parents[2]
RECIPE = str(ROOT / "recipes" / "era5_swin.yaml")
#: Four hours of one test day (one batch) keep the evaluation short.
ONE_DAY = ["--data.init_args.splits.test", '["2019-03-27", "2019-03-27"]', "--data.init_args.task.eval_stride", "6"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-step ERA5 Swin-TNP checkpoint on the embedded sample (prepared into a temporary cache), its variance
    calibration fitted on four validation hours."""
    yield from two_step_fit(tmp_path_factory.mktemp("era5_report"), RECIPE)


def two_step_fit(root: Path, recipe: str, *extra: str) -> Iterator[Path]:
    """Fit ``recipe`` for 2 steps into ``root`` (the sample prepared into ``root / "cache"``), its variance
    calibration fitted on four validation hours; yields ``last.ckpt`` (a module fixture's body)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("GRIDTNP_CACHE", str(root / "cache"))
    mp.setattr(sys, "argv", sys.argv[:1])  # LightningCLI warns when given both args and command-line arguments
    GridTNPCLI(
        args=[
            "fit", "--config", recipe, *extra, "--trainer.max_steps", "2", "--trainer.limit_val_batches", "1",
            "--trainer.val_check_interval", "2", "--trainer.default_root_dir", str(root),
            "--checkpoint.dirpath", str(root / "ckpt"), "--trainer.enable_progress_bar", "false",
            "--plots.every_n_validations", "0", "--trainer.logger", "false", "--trainer.num_sanity_val_steps", "0",
            "--data.init_args.splits.val", '["2019-03-22", "2019-03-22"]', "--data.init_args.task.eval_stride", "6",
        ]
    )  # fmt: skip
    yield root / "ckpt" / "last.ckpt"
    mp.undo()


@pytest.fixture(scope="module")
def kriging_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-step ``era5_mos_kriging`` fit in ``<runs>/era5_mos_kriging/checkpoints`` (where ``--compare
    era5_mos_kriging --runs <runs>`` finds it), calibrated on the same validation hours as ``checkpoint``."""
    root = tmp_path_factory.mktemp("era5_kriging")
    run = root / "runs" / "era5_mos_kriging"
    mp = pytest.MonkeyPatch()
    mp.setenv("GRIDTNP_CACHE", str(root / "cache"))
    mp.setattr(sys, "argv", sys.argv[:1])
    GridTNPCLI(
        args=[
            "fit", "--config", str(ROOT / "recipes" / "era5_mos_kriging.yaml"), "--trainer.max_steps", "2",
            "--trainer.limit_val_batches", "1", "--trainer.val_check_interval", "2",
            "--trainer.default_root_dir", str(run), "--checkpoint.dirpath", str(run / "checkpoints"),
            "--trainer.enable_progress_bar", "false", "--plots.every_n_validations", "0", "--trainer.logger", "false",
            "--trainer.num_sanity_val_steps", "0", "--data.init_args.splits.val", '["2019-03-22", "2019-03-22"]',
            "--data.init_args.task.eval_stride", "6",
        ]
    )  # fmt: skip
    yield root / "runs"
    mp.undo()


def test_coastlines_follow_the_plot_longitudes_across_the_date_line() -> None:
    uk = coastline_segments((-10.0, 2.0), (50.0, 58.0))
    assert len(uk) > 10 and all(s.shape[1] == 2 for s in uk)
    pacific = np.concatenate(coastline_segments((160.0, 200.0), (-50.0, -30.0)))  # New Zealand, 0..360 degrees
    assert pacific[:, 0].max() > 180.0 and pacific[:, 0].min() < 180.0
    borders = coastline_segments((-10.0, 2.0), (50.0, 58.0), "countries")
    assert borders  # Ireland / United Kingdom
    ax = Figure().add_subplot()
    ax.set_xlim(-10, 2)
    assert draw_coastlines(ax, (-10.0, 2.0), (50.0, 58.0)) is not None
    assert {c.get_gid() for c in ax.collections} == {"coastlines", "borders"}
    assert ax.get_xlim() == (-10, 2)


def test_antarctica_has_its_coast_without_the_closures_through_the_pole() -> None:
    """GSHHS closes both halves of Antarctica through the South Pole (along 0 and 180 degrees east); a global map
    draws the ice front and none of those edges."""
    south = coastline_segments((-180.0, 180.0), (-90.0, -60.0))
    points = np.concatenate(south)
    assert points[:, 1].min() > -80.0  # the Ross ice front is the southernmost coast, at about 78.6 S
    on_meridians = [s for s in south if (np.isin(s[:, 0], (0.0, 180.0, -180.0)).sum() > 1 and np.ptp(s[:, 0]) == 0)]
    assert not on_meridians
    assert sum(len(s) for s in south if s[:, 1].max() < -60.0) > 150  # the coast itself is kept


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_maps_in_kelvin_with_coastlines_and_calibration_by_kind(checkpoint: Path) -> None:
    from gridtnp.cli.evaluate import load_checkpoint
    from gridtnp.report.evaluation import run_split
    from gridtnp.report.evaluation_plots import split_figures

    cli = load_checkpoint([RECIPE], checkpoint, ONE_DAY)
    evaluation = run_split(cli.model, cli.datamodule, "test", 1)
    assert evaluation.physical is not None and evaluation.physical["observed"].attrs["units"] == "K"
    observed = evaluation.physical["observed"].values
    assert 250 < np.nanmean(observed) < 300  # kelvin, not departures
    figures = split_figures(evaluation, cli.model, cli.datamodule)
    assert {"task000", "reliability", "station_rmse", "station_series", "standardised_errors"} <= set(figures)
    maps = figures["task000"]
    labels = [ax.get_ylabel() for ax in maps.axes if ax.get_label() == "<colorbar>"]
    assert labels and all("[K]" in label or label == "z (1)" for label in labels), labels
    panels = [ax for ax in maps.axes if ax.get_label() != "<colorbar>"]
    assert all("coastlines" in {c.get_gid() for c in ax.collections} for ax in panels)
    titles = [ax.get_title() for ax in figures["reliability"].axes]
    assert any(t.startswith("held-out targets") for t in titles) and any(
        t.startswith("context targets") for t in titles
    )
    legend = [t.get_text() for t in figures["reliability"].axes[0].get_legend().get_texts()]
    assert any("mean z^2" in t and "90 %" in t for t in legend)


def test_gridtnp_plot_and_report_on_a_station_checkpoint(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "plots"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(
            [
                "plot",
                "--config",
                RECIPE,
                "--ckpt_path",
                str(checkpoint),
                "--out",
                str(out),
                "--num_tasks",
                "1",
                *ONE_DAY,
            ]
        )
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "test_reliability.png", "test_standardised_errors.png", "test_station_rmse.png", "test_station_series.png",
        "test_task000.png",
    ]  # fmt: skip
    assert not [w for w in caught if "sys.argv" in str(w.message)]
    assert "sys.argv" not in capsys.readouterr().err
    page = tmp_path / "report.html"
    main(["report", "--config", RECIPE, "--ckpt_path", str(checkpoint), "--out", str(page), *ONE_DAY])
    text = page.read_text()
    assert "<table>" in text and "heldout" not in re.sub(r"<pre>.*?</pre>", "", text, flags=re.S)
    assert "held-out" in text and "baseline_rmse_physical" in text and "rmse_physical" in text
    assert text.count("data:image/png;base64,") == 6  # two maps, calibration, two station figures, z histogram
    assert 'id="joint-none"' in text and "no joint covariance" in text  # an independent likelihood: no samples
    assert "http" not in text.split("<h2>Recipe</h2>")[0]
    with pytest.raises(SystemExit):  # an existing page is not replaced without --overwrite
        main(["report", "--config", RECIPE, "--ckpt_path", str(checkpoint), "--out", str(page)])
    screenshot_shows_the_page(page, tmp_path)


def test_report_compare_is_a_scorecard_with_breakdowns_and_observation_impact(
    checkpoint: Path, kriging_runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    page = tmp_path / "scorecard.html"
    main(
        [
            "report",
            "--ckpt_path",
            str(checkpoint),
            "--out",
            str(page),
            "--num_tasks",
            "1",
            "--compare",
            "era5_mos_kriging",
            "--runs",
            str(kriging_runs),
            "--impact_hours",
            "1",
            *ONE_DAY,
        ]
    )  # fmt: skip  (no --config: the config.yaml beside the checkpoint)
    assert "written to" in capsys.readouterr().out
    text = page.read_text()
    assert "<title>gridtnp evaluation: era5_swin (" in text  # the recipe named in config.yaml's first line
    for part in ("scorecard-physical", "scorecard-normalised", "breakdown-hour", "breakdown-distance", "impact_map"):
        assert f'id="{part}"' in text, part
    assert 'id="breakdown-coast"' in text or "basemap" not in text  # coast / inland where the coastline data is
    assert "RMSE skill vs coarse cell" in text and "log-likelihood gain vs coarse cell" in text
    assert "ERA5 at station locations" in text and "calibration_scale_observed" in text
    physical = text.split('id="scorecard-physical"')[1].split("</table>")[0]
    assert physical.count("<tr>") + physical.count("<tr ") == 4  # head, era5_swin, era5_mos_kriging, coarse cell
    assert "era5_mos_kriging" in physical and "coarse cell" in physical
    assert "Computed over 1 hour spread" in text  # the impact's hours are stated
    assert text.count("data:image/png;base64,") == 5 + 3  # one map, 4 figures; winners, breakdowns, impact
    with pytest.raises(SystemExit):
        main(["report", "--ckpt_path", str(checkpoint), "--out", str(tmp_path / "x.html"), "--compare", "era5_mos",
              "--runs", str(kriging_runs)])  # fmt: skip
    assert "no fitted checkpoint at" in capsys.readouterr().err  # and the command that fits it
    screenshot_shows_the_page(page, tmp_path, figures_on_screen=False)


def screenshot_shows_the_page(page: Path, tmp_path: Path, figures_on_screen: bool = True) -> None:
    """Headless Chromium: the page's title in the DOM, every figure decoded, no console message, and a screenshot
    with the table (and, with ``figures_on_screen``, coloured figures below it in the first 2,000 pixels; a
    scorecard's tables fill those)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium): the page is not rendered")
    flags = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--allow-file-access-from-files",
    ]
    shot = tmp_path / "shot.png"
    try:
        dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=60)
        subprocess.run(
            [*flags, f"--screenshot={shot}", "--window-size=1280,2000", page.as_uri()], capture_output=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        pytest.skip(f"chromium could not start here: {err}")
    if dom.returncode != 0 or not shot.is_file():
        pytest.skip(f"chromium could not start here: {dom.stderr.strip().splitlines()[-1:]}")
    assert "<title>gridtnp evaluation: " in dom.stdout
    every_figure_loads_without_console_errors(page, flags, tmp_path)
    from matplotlib.image import imread

    image = imread(shot)[..., :3]  # [H, W, 3] in 0..1
    assert image.shape[:2] == (2000, 1280)
    ink = (image < 0.5).any(-1)  # dark pixels: text and table lines
    colour = image.max(-1) - image.min(-1) > 0.3  # saturated pixels: the figures' colour maps
    top, bottom = slice(0, 500), slice(500, 2000)
    assert ink[top].mean() > 0.005, "no table or title drawn at the top of the page"
    assert not figures_on_screen or colour[bottom].mean() > 0.01, "no figure drawn below the table"


def test_held_out_targets_are_placed_on_their_stations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from gridtnp.data import StationReanalysisDataModule

    monkeypatch.setenv("GRIDTNP_CACHE", str(tmp_path / "cache"))
    dm = from_flat_arguments(StationReanalysisDataModule, targets="held_out", batch_size=4, climatology=True)
    dm.prepare_data()
    dm.setup("test")
    batch = next(iter(dm.test_dataloader()))
    target = batch.target
    output = {"mean": target.y, "std": torch.ones_like(target.y), "x": target.x, "y": target.y, "mask": target.mask}
    ds = dm.predictions_to_xarray([{**output, **batch.extras}])
    assert ds.sizes["station"] == dm.task.num_stations and target.x.shape[1] < dm.task.num_stations
    observed, mean = ds["observed"].values, ds["mean"].values
    np.testing.assert_array_equal(np.isfinite(observed), np.isfinite(mean))
    assert (np.isfinite(observed).sum(1) == target.mask.sum(1).numpy()).all()  # one value per held-out target
    np.testing.assert_allclose(observed[np.isfinite(observed)], mean[np.isfinite(mean)], atol=1e-3)
    assert 250 < np.nanmean(observed) < 300 and not ds["is_context"].values.any()
    assert np.isfinite(ds["baseline_sq_error"].values).sum() == int(target.mask.sum())


#: Added to a copy of the page: after it loads, the number of images and of those that failed to decode.
IMAGE_CHECK = (
    "<script>window.addEventListener('load', () => { const images = [...document.images]; "
    "const bad = images.filter((i) => !i.complete || i.naturalWidth === 0).length; "
    "document.body.setAttribute('data-images', images.length + ':' + bad); });</script>"
)


def every_figure_loads_without_console_errors(page: Path, flags: list[str], tmp_path: Path) -> None:
    """Every ``<img>`` of the page decodes in Chromium, and the page logs nothing to the console."""
    copy = tmp_path / "image_check.html"
    copy.write_text(page.read_text().replace("</body>", IMAGE_CHECK + "</body>"))
    run = subprocess.run(
        [*flags, "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", "--dump-dom", copy.as_uri()],
        capture_output=True,
        text=True,
        timeout=60,
    )
    found = re.search(r'data-images="(\d+):(\d+)"', run.stdout)
    assert found, "the image check did not run in Chromium"
    images, broken = int(found.group(1)), int(found.group(2))
    assert images == page.read_text().count("<img ") and broken == 0, f"{broken} of {images} figures did not load"
    console = [line for line in run.stderr.splitlines() if "CONSOLE" in line]
    assert not console, console
