"""Predictions as xarray: ``gridtnp predict`` on the ERA5 sample recipe, and the Python API on xarray inputs."""

from __future__ import annotations

import warnings
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
import xarray as xr

from gridtnp import NeuralProcessModule
from gridtnp.batch import Observations
from gridtnp.cli import GridTNPCLI
from gridtnp.inference.cells import cell_weights
from gridtnp.inference.predictions import predict, raw_predictions
from gridtnp.registry import ConfigError

ROOT = Path(__file__).resolve().parents[1]
RECIPE = str(ROOT / "recipes" / "era5_swin.yaml")


def cli(*args: str) -> GridTNPCLI:
    return GridTNPCLI(args=list(args))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-step ERA5 Swin-TNP checkpoint on the embedded sample (prepared into a temporary cache)."""
    root = tmp_path_factory.mktemp("era5_predict")
    mp = pytest.MonkeyPatch()
    mp.setenv("GRIDTNP_CACHE", str(root / "cache"))
    cli(
        "fit", "--config", RECIPE, "--trainer.max_steps", "2", "--trainer.limit_val_batches", "1",
        "--trainer.val_check_interval", "2", "--trainer.default_root_dir", str(root),
        "--checkpoint.dirpath", str(root / "ckpt"), "--trainer.enable_progress_bar", "false",
        "--plots.every_n_validations", "0", "--trainer.logger", "false",
    )  # fmt: skip
    yield root / "ckpt" / "last.ckpt"
    mp.undo()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_predict_writes_station_predictions_with_units_and_provenance(checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "stations.nc"
    cli(
        "predict", "--config", RECIPE, "--ckpt_path", str(checkpoint), "--predictions.path", str(out),
        "--data.init_args.loader.batch_size", "48", "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(tmp_path),
    )  # fmt: skip
    with xr.open_dataset(out) as ds:
        assert ds["t2m"].dims == ("station", "time") and ds.sizes["time"] == 5 * 24  # 27-31 March, every hour
        assert str(ds.time.values[0])[:13] == "2019-03-27T00" and str(ds.time.values[-1])[:13] == "2019-03-31T23"
        assert ds["t2m"].attrs["units"] == ds["t2m_std"].attrs["units"] == "K"
        assert {"latitude", "longitude"} <= set(ds.coords) and ds["latitude"].dims == ("station",)
        assert float(ds.latitude.min()) > 49.9 and float(ds.latitude.max()) < 58.1
        assert float(ds["t2m_std"].min()) > 0 and np.isfinite(ds["t2m"].values).all()
        assert 250 < float(ds["observed"].mean()) < 290  # ERA5 t2m at the stations, in kelvin
        share = float(ds["is_context"].mean())
        assert 0.1 < share < 0.2  # the middle of the recipe's U[0, 0.3]
        assert ds.attrs["checkpoint"] == str(checkpoint) and ds.attrs["recipe"] == RECIPE
        assert "grid_encoder" in ds.attrs["recipe_text"]
        # CF station time series, as predict gives them (tests/test_prediction_cf.py), with the ERA5 attribution.
        assert ds.attrs["Conventions"] == "CF-1.10" and ds.attrs["featureType"] == "timeSeries"
        assert ds["station"].attrs["cf_role"] == "timeseries_id" and ds.station.dtype.kind in "OU"
        assert ds["t2m"].dtype == ds["t2m_std"].dtype == ds["observed"].dtype == np.float32
        assert ds["t2m"].attrs["standard_name"] == "air_temperature"
        assert ds["t2m_std"].attrs["standard_name"] == "air_temperature standard_error"
        assert ds["is_context"].attrs["flag_meanings"] == "held_out context"
        assert "Copernicus" in ds.attrs["license"] and "ERA5" in ds.attrs["source"]
        assert ds.attrs["source"].startswith("gridtnp predictions")
        first = str(ds.station.values[0])
    matplotlib.use("Agg")
    xr.open_dataset(out).t2m.sel(station=first).plot()  # one station's series, in one line
    xr.open_dataset(out).isel(time=0).plot.scatter(x="longitude", y="latitude", hue="t2m")  # one hour's map
    plt.close("all")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_predict_on_a_dense_grid_to_zarr(checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "grid.zarr"
    cli(
        "predict", "--config", RECIPE, "--ckpt_path", str(checkpoint), "--predictions.path", str(out),
        "--data.init_args.predict.resolution", "0.5", "--data.init_args.predict.split", "val",
        "--data.init_args.loader.batch_size", "60", "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(tmp_path),
    )  # fmt: skip
    ds = xr.open_dataset(out, engine="zarr")
    assert ds["t2m"].dims == ("time", "latitude", "longitude") and ds.sizes["time"] == 5 * 24
    np.testing.assert_allclose(ds.latitude.values, np.arange(50.0, 58.01, 0.5))
    np.testing.assert_allclose(ds.longitude.values, np.arange(-10.0, 2.01, 0.5))
    assert ds["t2m"].attrs["units"] == "K" and np.isfinite(ds["t2m"].values).all()
    assert ds["t2m"].attrs["standard_name"] == "air_temperature" and "featureType" not in ds.attrs


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_zarr_written_batch_by_batch_equals_the_netcdf_written_at_once(checkpoint: Path, tmp_path: Path) -> None:
    """Zarr predictions are appended ``tasks_per_write`` tasks at a time (bounded memory): the same dataset, values,
    coordinates and attributes, as the NetCDF file written in one go; Lightning keeps no outputs meanwhile."""
    common = [
        "--config", RECIPE, "--ckpt_path", str(checkpoint), "--data.init_args.loader.batch_size", "7",
        "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(tmp_path),
    ]  # fmt: skip
    run = cli("predict", *common, "--predictions.path", str(tmp_path / "p.zarr"), "--predictions.tasks_per_write", "20")
    assert not run.trainer.predict_loop.predictions  # nothing held besides what was written
    cli("predict", *common, "--predictions.path", str(tmp_path / "p.nc"))
    streamed, once = xr.open_zarr(tmp_path / "p.zarr").load(), xr.open_dataset(tmp_path / "p.nc").load()
    xr.testing.assert_identical(streamed, once)
    assert streamed.sizes["time"] == 5 * 24 and not list(tmp_path.glob(".p.zarr.tmp-*"))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_predict_writes_samples_in_kelvin_on_a_sample_dimension(checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "samples.nc"
    cli(
        "predict", "--config", RECIPE, "--ckpt_path", str(checkpoint), "--predictions.path", str(out),
        "--predictions.samples", "4", "--data.init_args.loader.batch_size", "48", "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path),
    )  # fmt: skip
    with xr.open_dataset(out) as ds:
        assert ds["t2m_sample"].dims == ("station", "time", "sample") and ds.sizes["sample"] == 4
        assert ds["sample"].attrs["standard_name"] == "realization" and ds["t2m_sample"].attrs["units"] == "K"
        # Each sample is converted as the mean (climatology added back): kelvin, within a few std of the mean.
        z = (ds["t2m_sample"] - ds["t2m"]) / ds["t2m_std"]
        assert np.isfinite(ds["t2m_sample"].values).all() and float(np.abs(z).max()) < 8
        assert 0.5 < float((z**2).mean()) < 1.5


def small_station_model() -> NeuralProcessModule:
    return NeuralProcessModule(
        dim_x=2, dim_y={"grid": 1, "stations": 1}, target_source="stations", dim=16,
        encoder={"name": "mlp"}, grid_encoder={"name": "identity"}, processor={"name": "transformer", "layers": 1},
        grid_decoder={"name": "cross_attention"}, likelihood={"name": "gaussian"},
    )  # fmt: skip


@pytest.mark.filterwarnings("ignore:predict. the gridded context:UserWarning")  # inputs partial on purpose
def test_python_api_round_trips_xarray_coordinates_and_matches_the_model() -> None:
    torch.manual_seed(0)
    module = small_station_model()
    lat, lon, time = np.arange(50.0, 52.1, 1.0), np.arange(-2.0, 1.1, 1.0), np.array(["2019-03-01", "2019-03-02"])
    rng = np.random.default_rng(0)
    grid = xr.DataArray(
        280 + rng.standard_normal((2, 3, 4)), dims=("time", "latitude", "longitude"),
        coords={"time": time, "latitude": lat, "longitude": lon},
    )  # fmt: skip
    grid[0, 1, 1] = np.nan  # a missing cell: masked, not fed to the model
    stations = xr.DataArray(
        280 + rng.standard_normal((2, 5)), dims=("time", "station"),
        coords={"time": time, "latitude": ("station", rng.uniform(50, 52, 5)),
                "longitude": ("station", rng.uniform(-2, 1, 5)), "station_id": ("station", list("abcde"))},
    )  # fmt: skip
    targets = xr.Dataset(coords={"latitude": np.linspace(50, 52, 7), "longitude": np.linspace(-2, 1, 9)})
    stats = {"grid": (280.0, 2.0), "stations": (280.0, 2.0)}
    out = predict(module, {"grid": grid, "stations": stations}, targets, stats=stats, target_stats=(280.0, 2.0),
                  batch_dim="time")  # fmt: skip
    assert out["mean"].dims == ("time", "latitude", "longitude") and out["mean"].shape == (2, 7, 9)
    np.testing.assert_array_equal(out.latitude.values, targets.latitude.values)
    assert list(out.time.values) == list(time)

    # The same tasks as tensors, straight through the model.
    la, lo = np.meshgrid(lat, lon, indexing="ij")
    xg = torch.tensor(np.stack([la.ravel(), lo.ravel()], -1), dtype=torch.float32).expand(2, -1, -1)
    yg = torch.tensor((grid.values.reshape(2, -1, 1) - 280.0) / 2.0, dtype=torch.float32)
    xs = torch.tensor(np.stack([stations.latitude.values, stations.longitude.values], -1), dtype=torch.float32)
    ys = torch.tensor((stations.values[..., None] - 280.0) / 2.0, dtype=torch.float32)
    tl, to = np.meshgrid(targets.latitude.values, targets.longitude.values, indexing="ij")
    xt = torch.tensor(np.stack([tl.ravel(), to.ravel()], -1), dtype=torch.float32).expand(2, -1, -1)
    module.eval()
    with torch.no_grad():
        context = {"grid": Observations(xg, yg), "stations": Observations(xs.expand(2, -1, -1), ys)}
        dist = module.model(context, xt)
    np.testing.assert_allclose(out["mean"].values.reshape(2, -1), dist.mean[..., 0].numpy() * 2.0 + 280.0, rtol=1e-5)
    np.testing.assert_allclose(out["std"].values.reshape(2, -1), dist.stddev[..., 0].numpy() * 2.0, rtol=1e-5)

    # Station targets: the output keeps the station dimension and its coordinates.
    at_stations = predict(
        module, {"grid": grid.isel(time=0), "stations": stations.isel(time=0)}, stations.isel(time=0), stats=stats
    )
    assert at_stations["mean"].dims == ("station",) and list(at_stations.station.values) == list("abcde")
    assert at_stations["station"].attrs["cf_role"] == "timeseries_id"  # the given ids, as CF's station identifier


def test_raw_predictions_pad_to_the_widest_batch() -> None:
    def output(n: int) -> dict[str, torch.Tensor]:
        mask = torch.ones(2, n, dtype=torch.bool)
        return {"mean": torch.zeros(2, n, 1), "std": torch.ones(2, n, 1), "x": torch.zeros(2, n, 2), "mask": mask}

    outputs = [output(3), output(5)]
    ds = raw_predictions(outputs)
    assert ds["mean"].shape == (4, 5, 1) and np.isnan(ds["mean"].values[:2, 3:]).all()
    assert np.isfinite(ds["mean"].values[2:]).all()


@pytest.mark.filterwarnings("ignore:predict. the gridded context:UserWarning")  # inputs partial on purpose
def test_python_api_checks_its_inputs() -> None:
    """Latitudes beyond the poles are refused, 0-360 longitudes are wrapped, physical units need stats, inf is NaN."""
    torch.manual_seed(0)
    module = small_station_model()
    rng = np.random.default_rng(1)
    lat, lon = np.arange(50.0, 52.1, 1.0), np.arange(-2.0, 1.1, 1.0)
    grid = xr.DataArray(
        rng.standard_normal((3, 4)), dims=("latitude", "longitude"), coords={"latitude": lat, "longitude": lon}
    )
    stations = xr.DataArray(
        rng.standard_normal(5), dims=("station",),
        coords={"latitude": ("station", rng.uniform(50, 52, 5)), "longitude": ("station", rng.uniform(-2, 1, 5))},
    )  # fmt: skip
    targets = xr.Dataset(coords={"latitude": np.linspace(50, 52, 3), "longitude": np.linspace(-2, 1, 4)})
    out = predict(module, {"grid": grid, "stations": stations}, targets)
    east = targets.assign_coords(longitude=targets.longitude % 360)  # the same points, longitudes in 0-360
    shifted = grid.assign_coords(longitude=grid.longitude % 360)
    out_360 = predict(module, {"grid": shifted, "stations": stations}, east)
    np.testing.assert_allclose(out_360["mean"].values, out["mean"].values, rtol=1e-6)
    with pytest.raises(ConfigError, match=r"latitudes outside \[-90, 90\] \(e.g. 100"):
        predict(module, {"grid": grid, "stations": stations}, targets.assign_coords(latitude=[50.0, 51.0, 100.0]))
    with pytest.raises(ConfigError, match=r"physical units.*Pass stats=\{'grid'"):
        predict(module, {"grid": grid + 280.0, "stations": stations}, targets)
    inf = grid.copy()
    inf[0, 0], nan = np.inf, grid.copy()
    nan[0, 0] = np.nan
    np.testing.assert_array_equal(
        predict(module, {"grid": inf, "stations": stations}, targets)["mean"].values,
        predict(module, {"grid": nan, "stations": stations}, targets)["mean"].values,
    )


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_predict_from_a_checkpoint_alone_uses_its_statistics_and_units(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fit saves the data's statistics, names and units in the checkpoint; predict needs nothing else."""
    saved = torch.load(checkpoint, weights_only=True)["gridtnp_data"]
    assert saved["sources"] == {"grid": ["t2m"], "stations": ["t2m"]} and saved["target"] == ["t2m"]
    t2m = saved["variables"]["t2m"]
    assert t2m["units"] == "K" and 270 < t2m["mean"] < 290 and 0 < t2m["std"] < 20 and t2m["long_name"]
    # The recipe's values are departures from the training dates' hourly climatology: the checkpoint keeps it.
    climatology = torch.load(checkpoint, weights_only=True)["gridtnp_data"]["climatology"]
    clim_lat, clim_lon = climatology["latitude"].numpy(), climatology["longitude"].numpy()
    clim = climatology["variables"]["t2m"].double().numpy()[12]  # [H, W] at 12 UTC
    assert climatology["variables"]["t2m"].shape == (24, len(clim_lat), len(clim_lon)) and 270 < clim.mean() < 290
    monkeypatch.setenv("GRIDTNP_CACHE", str(tmp_path / "no_store_here"))  # no store, no DataModule
    module = NeuralProcessModule.load_from_checkpoint(checkpoint, map_location="cpu")
    rng = np.random.default_rng(0)
    lat, lon = np.arange(50.5, 58.0, 1.0), np.arange(-9.5, 2.0, 1.0)
    kelvin, noon = {"units": "K"}, np.datetime64("2019-03-28T12:00")
    grid = xr.DataArray(
        278 + 3 * rng.standard_normal((len(lat), len(lon))), dims=("latitude", "longitude"),
        coords={"latitude": lat, "longitude": lon, "time": noon}, attrs=kelvin,
    )  # fmt: skip
    stations = xr.DataArray(
        278 + 3 * rng.standard_normal(6), dims=("station",), attrs=kelvin,
        coords={"latitude": ("station", rng.uniform(51, 57, 6)), "longitude": ("station", rng.uniform(-8, 1, 6))},
    )  # fmt: skip
    targets = xr.Dataset(coords={"latitude": np.linspace(51, 57, 4), "longitude": np.linspace(-8, 1, 5)})
    out = predict(module, {"grid": grid, "stations": stations}, targets)
    out = out.rename({"t2m": "mean", "t2m_std": "std"})  # named for the checkpoint's target variable
    assert out["mean"].attrs["units"] == out["std"].attrs["units"] == "K"
    assert 250 < float(out["mean"].mean()) < 300 and float(out["std"].min()) > 0

    # The same as taking the departures by hand (each 1 degree cell: the mean of its 4 x 4 fine points; a station:
    # its nearest point), normalising them with the saved std and adding the climatology back at the targets.
    def nearest(values, axis):
        return np.abs(np.asarray(values)[:, None] - axis[None]).argmin(1)

    cells = np.zeros((len(lat), len(lon)))
    for i, a in enumerate(lat):
        for j, b in enumerate(lon):
            rows = (clim_lat >= a - 0.5) & (clim_lat < a + 0.5)
            cols = (clim_lon >= b - 0.5) & (clim_lon < b + 0.5)
            cells[i, j] = clim[np.ix_(rows, cols)].mean()
    at_stations = clim[nearest(stations.latitude, clim_lat), nearest(stations.longitude, clim_lon)]
    s = t2m["std"]
    by_hand = {"grid": ((grid - cells) / s).drop_attrs(), "stations": ((stations - at_stations) / s).drop_attrs()}
    unit = {"grid": (0.0, 1.0), "stations": (0.0, 1.0)}
    ref = predict(module, by_hand, targets, stats=unit, target_stats=(0.0, s))
    t_lat, t_lon = np.meshgrid(targets.latitude, targets.longitude, indexing="ij")
    at_targets = clim[nearest(t_lat.ravel(), clim_lat), nearest(t_lon.ravel(), clim_lon)].reshape(t_lat.shape)
    np.testing.assert_allclose(out["mean"].values, ref["mean"].values + at_targets, rtol=1e-5)
    np.testing.assert_allclose(out["std"].values, ref["std"].values, rtol=1e-5)
    # Longitudes given as 0-360 find the same grid points of the climatology (and the same prediction).
    east = {"grid": grid.assign_coords(longitude=grid.longitude % 360), "stations": stations.assign_coords(
        longitude=("station", stations.longitude.values % 360))}  # fmt: skip
    np.testing.assert_allclose(predict(module, east, targets)["t2m"].values, out["mean"].values, rtol=1e-5)
    # Already normalised values are not normalised twice in silence.
    with pytest.raises(ConfigError, match=r"normalised with the checkpoint's statistics .* already normalised"):
        predict(module, by_hand, targets)
    # Statistics for the context but not the targets would leave the climatology off the result: refused.
    with pytest.raises(ConfigError, match="pass both stats and target_stats"):
        predict(module, by_hand, targets, stats=unit)
    # Without the time the climatology cannot be taken off: refused, not guessed.
    with pytest.raises(ConfigError, match="the context needs its time"):
        predict(module, {"grid": grid.drop_vars("time"), "stations": stations}, targets)
    # A model whose checkpoint has no statistics refuses kelvin, even values that look small (units say so).
    bare = small_station_model()
    with pytest.raises(ConfigError, match=r"context 'grid' has units 'K'.*neither the caller nor the model"):
        predict(bare, {"grid": (grid - 278.0), "stations": stations}, targets)


def test_a_model_of_a_box_across_the_date_line_reads_its_longitudes_past_180() -> None:
    """A model trained on a date-line store (longitudes 150 to 190) given fields in [-180, 180) or 0-360: the same
    points, within the grid, so the same predictions and no warning that they lie outside it."""
    torch.manual_seed(0)
    module = NeuralProcessModule(
        dim_x=2, dim_y={"grid": 1}, target_source="grid", dim=16,
        grid={"lower": [-20.0, 150.0], "upper": [20.0, 190.0], "shape": [4, 4]},
        encoder={"name": "mlp"}, grid_encoder={"name": "pseudo_token"}, processor={"name": "swin", "layers": 1},
        grid_decoder={"name": "knn", "k": 4}, likelihood={"name": "gaussian"},
    )  # fmt: skip
    lat, lon = np.arange(-20.0, 20.1, 10.0), np.array([150.0, 160.0, 170.0, 180.0, 190.0])
    values = 280 + np.random.default_rng(0).standard_normal((len(lat), len(lon)))
    targets = xr.Dataset(coords={"latitude": [-5.0, 5.0], "longitude": [175.0, 185.0]})
    stats = {"grid": (280.0, 2.0)}
    out = {}
    for name, shift in (("past 180", 0.0), ("-180 to 180", -360.0)):
        east = lon + np.where(lon >= 180.0, shift, 0.0)
        grid = xr.DataArray(values, dims=("latitude", "longitude"), coords={"latitude": lat, "longitude": east})
        there = targets.assign_coords(longitude=targets.longitude + np.where(targets.longitude >= 180, shift, 0.0))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # outside the model's grid: a warning
            out[name] = predict(module, {"grid": grid}, there, stats=stats, target_stats=(280.0, 2.0))
    np.testing.assert_allclose(out["past 180"]["mean"].values, out["-180 to 180"]["mean"].values, rtol=1e-6)


def test_climatology_cells_of_a_date_line_grid_are_found_from_either_convention() -> None:
    """A checkpoint trained on a box across the date line keeps its climatology on longitudes 150 to 200: context
    cells given at -170 and -160 (or 190 and 200) average the grid points of those cells, not the nearest edge."""
    axis = np.arange(150.0, 200.1, 5.0)
    for centres in (np.array([-170.0, -160.0]), np.array([190.0, 200.0])):
        weights = cell_weights(centres, axis, "longitude")
        np.testing.assert_array_equal(np.flatnonzero(weights[0]), np.flatnonzero(np.isin(axis, [185.0, 190.0])))
        np.testing.assert_array_equal(np.flatnonzero(weights[1]), np.flatnonzero(np.isin(axis, [195.0, 200.0])))


def test_gridtnp_predictions_is_an_alias_of_gridtnp_inference(tmp_path: Path) -> None:
    import gridtnp.inference
    import gridtnp.predictions

    for name in gridtnp.inference.__all__:
        assert getattr(gridtnp.predictions, name) is getattr(gridtnp.inference, name), name
    for source in ("gridtnp.inference.predict", "gridtnp.predictions.predict", "gridtnp predictions"):
        path = tmp_path / f"{source.replace(' ', '_')}.nc"
        xr.Dataset({"t2m": ("x", np.zeros(2))}, attrs={"source": source}).to_netcdf(path)
        assert gridtnp.inference.is_prediction_file(path), source
    other = tmp_path / "other.nc"
    xr.Dataset({"t2m": ("x", np.zeros(2))}, attrs={"source": "ERA5"}).to_netcdf(other)
    assert not gridtnp.inference.is_prediction_file(other)
