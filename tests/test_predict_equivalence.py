"""``gridtnp.inference.predict`` equals the module's own path (``predict_step``, as ``gridtnp test`` and
``gridtnp predict`` run it) on the DataModule's test tasks, for every ERA5 recipe kind the embedded sample serves.

The xarray inputs are built here by hand from the sample's NetCDF file with plain xarray and numpy (kelvin, 1-D
coordinates, the coarse field with the DataModule's partial edge blocks), not with the project's own input
functions: only which stations are context and which points are targets comes from the tasks. Models are the
recipes' own specs made small, with perturbed initial weights and a variance calibration whose two scales differ
from 1 and from each other, so a context station given the held-out scale (or the reverse) shows.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import xarray as xr
import yaml

from gridtnp import NeuralProcessModule
from gridtnp.batch import Batch, Observations
from gridtnp.cli import GridTNPCLI
from gridtnp.data import sample_path
from gridtnp.inference import predict
from gridtnp.inference.coverage import warn_uncovered_batch

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter:UserWarning")
ROOT = Path(__file__).resolve().parents[1]
SCALE, SCALE_OBSERVED = 1.7, 0.3
SMALL = {  # the recipes' models made small (the rest of each spec as the recipe has it)
    "era5_swin": {"dim": 16, "processor": {"name": "swin", "layers": 1, "window": 4, "shift": 2}},
    "era5_mos": {},
    "era5_mos_kriging": {},
    "era5_pt_tnp": {"dim": 16, "processor": {"name": "perceiver", "num_tokens": 8, "layers": 1}},
    "era5_multisource_swin": {"dim": 16, "processor": {"name": "swin", "layers": 1, "window": 4, "shift": 2}},
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One prepared copy of the embedded sample for every recipe here."""
    root = tmp_path_factory.mktemp("equivalence")
    mp = pytest.MonkeyPatch()
    mp.setenv("GRIDTNP_CACHE", str(root / "cache"))
    yield root
    mp.undo()


def recipe_parts(name: str, root: Path) -> tuple[NeuralProcessModule, Any]:
    """The recipe's DataModule (through the CLI) and a small model of its spec with a non-trivial calibration."""
    recipe = ROOT / "recipes" / f"{name}.yaml"
    cli = GridTNPCLI(run=False, args=["--config", str(recipe), "--trainer.logger", "false",
                                      "--trainer.default_root_dir", str(root)])  # fmt: skip
    datamodule = cli.datamodule
    datamodule.setup("test")
    spec = yaml.safe_load(recipe.read_text())["model"]["init_args"]
    spec.update(SMALL[name], variance_calibration=True)
    if "grid_encoder" in spec and spec["grid_encoder"].get("mlp_dim"):
        spec["grid_encoder"]["mlp_dim"] = 32
    if spec.get("kriging"):
        spec["kriging"]["rank"] = 4
    torch.manual_seed(0)
    module = NeuralProcessModule(**spec)
    with torch.no_grad():
        for p in module.parameters():  # zero-initialised tables would hide the context's effect
            p.add_(0.05 * torch.randn_like(p))
        module.std_scale.fill_(SCALE)
        module.std_scale_observed.fill_(SCALE_OBSERVED)
        module.std_scale_fitted.fill_(True)
    module.data_metadata = datamodule.variable_metadata()  # what a checkpoint written by gridtnp fit keeps
    module.eval()
    return module, datamodule


def module_path(
    module: NeuralProcessModule, datamodule: Any, tasks: int = 4, split: str = "test"
) -> tuple[Batch, dict[str, torch.Tensor]]:
    """The first ``tasks`` tasks of the ``split`` loader (``test``: hours or windows as ``gridtnp test`` scores them;
    ``predict``: as ``gridtnp predict`` writes them), padded as in their batch, and the module's outputs on them
    (``predict_step``, calibrated with the batch)."""
    full = next(iter(getattr(datamodule, f"{split}_dataloader")()))

    def first(obs: Observations) -> Observations:
        return Observations(obs.x[:tasks], None if obs.y is None else obs.y[:tasks], obs.mask[:tasks], obs.name)

    context = {name: first(obs) for name, obs in full.context.items()}
    batch = Batch(context, first(full.target), {k: v[:tasks] for k, v in full.extras.items()})
    with torch.no_grad():
        return batch, module.predict_step(batch, 0)


def coarse_blocks(field: xr.DataArray, factor: int, offset: tuple[int, int]) -> xr.DataArray:
    """Block means of a ``(latitude, longitude)`` field (ascending axes) in ``factor`` blocks whose first edge lies
    ``offset`` fine cells in (partial blocks at both ends kept, NaN-aware), at the mean of each block's coordinates."""
    lat, lon = field.latitude.values, field.longitude.values
    rows = (np.arange(len(lat)) + (factor - offset[0]) % factor) // factor
    cols = (np.arange(len(lon)) + (factor - offset[1]) % factor) // factor
    values = field.values.astype(np.float64)
    out = np.full((rows.max() + 1, cols.max() + 1), np.nan)
    for i in range(rows.max() + 1):
        for j in range(cols.max() + 1):
            block = values[np.ix_(rows == i, cols == j)]
            if np.isfinite(block).any():
                out[i, j] = np.nanmean(block)
    block_lat = np.array([lat[rows == i].mean() for i in range(rows.max() + 1)])
    block_lon = np.array([lon[cols == j].mean() for j in range(cols.max() + 1)])
    coords = {"latitude": block_lat, "longitude": block_lon, "time": field.time.values}
    return xr.DataArray(out, dims=("latitude", "longitude"), coords=coords, attrs={"units": "K"})


def at_points(field: xr.DataArray, x: np.ndarray) -> xr.DataArray:
    """``field`` at the grid points ``x [N, 2]`` (lat, lon), as a ``(station,)`` array with their coordinates."""
    lat = xr.DataArray(x[:, 0].astype(np.float64), dims="station")
    lon = xr.DataArray(x[:, 1].astype(np.float64), dims="station")
    return field.sel(latitude=lat, longitude=lon, method="nearest").assign_coords(latitude=lat, longitude=lon)


@pytest.mark.parametrize("name", ["era5_swin", "era5_mos", "era5_mos_kriging", "era5_pt_tnp"])
def test_predict_equals_the_module_path_on_station_tasks(name: str, cache: Path) -> None:
    """Means and stds in kelvin agree to 1e-5 at context stations and at held-out stations, climatology (taken off
    each coarse block over the block's own fine points, partial edge blocks included) and calibration included."""
    module, datamodule = recipe_parts(name, cache)
    batch, out = module_path(module, datamodule)
    expected = datamodule.predictions_to_xarray([out])  # kelvin on (time, station), climatology added back
    t2m = xr.open_dataset(sample_path())["t2m"].load().sortby("latitude")  # the raw sample: kelvin, 1-D coordinates
    factor, offset = datamodule.layouts["eval"][0][0], datamodule.layouts["eval"][1]
    compared = {"context": 0, "held-out": 0}
    for b in range(batch.batch_size):
        time = expected.time.values[b]
        field = t2m.sel(time=time).assign_attrs(units="K")
        stations = batch.context["stations"]
        context_x = stations.x[b][stations.mask[b]].numpy()
        target_x = batch.target.x[b][batch.target.mask[b]].numpy()
        context = {"grid": coarse_blocks(field, factor, offset), "stations": at_points(field, context_x)}
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the DataModule's grid covers the model's domain: no warning
            got = predict(module, context, at_points(field, target_x))
            warn_uncovered_batch(module.model, batch.context, batch.target)  # nor through gridtnp predict
        is_context = out["is_context"][b][batch.target.mask[b]].numpy()
        want_mean = expected["mean"].values[b][batch.target.mask[b].numpy()]
        want_std = expected["std"].values[b][batch.target.mask[b].numpy()]
        for subset, rows in (("context", is_context), ("held-out", ~is_context)):
            np.testing.assert_allclose(got["t2m"].values[rows], want_mean[rows], rtol=1e-5, err_msg=subset)
            np.testing.assert_allclose(got["t2m_std"].values[rows], want_std[rows], rtol=1e-5, err_msg=subset)
            compared[subset] += int(rows.sum())
    assert compared["context"] > 0 and compared["held-out"] > 0


def test_predict_equals_the_module_path_on_multisource_tasks(cache: Path) -> None:
    """The multi-source task (x = hour in the window, lat, lon) as ``gridtnp predict`` runs it: scattered context
    points of each window as a point table in kelvin, every point of the window a target; means and stds agree to
    1e-5 at the targets that are context points (their own calibration scale) and at the others."""
    module, datamodule = recipe_parts("era5_multisource_swin", cache)
    batch, out = module_path(module, datamodule, tasks=2, split="predict")
    t2m = xr.open_dataset(sample_path())["t2m"].load()
    times = datamodule.time_axis
    mean, std = (datamodule.task.mean["t2m"], datamodule.task.std["t2m"])  # the store's normalisation
    for b in range(batch.batch_size):
        start = int(out["start_hour"][b])

        def table(x: np.ndarray, start: int = start) -> xr.DataArray:
            hour = xr.DataArray(x[:, 0].astype(np.float64), dims="point")
            lat = xr.DataArray(x[:, 1].astype(np.float64), dims="point")
            lon = xr.DataArray(x[:, 2].astype(np.float64), dims="point")
            when = xr.DataArray(times[start + x[:, 0].astype(int)].values, dims="point")
            values = t2m.sel(time=when, latitude=lat, longitude=lon, method="nearest")
            coords = {"hour": hour, "latitude": lat, "longitude": lon}
            return xr.DataArray(values.values.astype(np.float64), dims="point", coords=coords, attrs={"units": "K"})

        source = batch.context["t2m"]
        context = {"t2m": table(source.x[b][source.mask[b]].numpy())}
        valid = batch.target.mask[b].numpy()
        targets = table(batch.target.x[b].numpy()[valid])
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # scattered points, not a grid: no coverage warning
            got = predict(module, context, targets, coords=("hour", "latitude", "longitude"))
            warn_uncovered_batch(module.model, batch.context, batch.target)
        context_keys = {tuple(p) for p in source.x[b][source.mask[b]].tolist()}
        at_context = np.array([tuple(p) in context_keys for p in batch.target.x[b][valid].tolist()])
        assert 0 < at_context.sum() < len(at_context)
        want_mean, want_std = out["mean"][b, valid, 0].numpy() * std + mean, out["std"][b, valid, 0].numpy() * std
        for subset, rows in (("context", at_context), ("held-out", ~at_context)):
            np.testing.assert_allclose(got["t2m"].values[rows], want_mean[rows], rtol=1e-5, err_msg=subset)
            np.testing.assert_allclose(got["t2m_std"].values[rows], want_std[rows], rtol=1e-5, err_msg=subset)
