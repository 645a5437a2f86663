"""The grids users give ``predict``: each cell's extent (CF bounds, or the spacing around it with partial edge
cells), grids on 2-D coordinates, and the one-line warning for a grid that leaves part of the domain uncovered."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import xarray as xr

from gridtnp import NeuralProcessModule
from gridtnp.batch import Observations
from gridtnp.inference import predict
from gridtnp.inference.cells import cell_edges, cell_weights
from gridtnp.inference.climatology import departures_from_reference
from gridtnp.inference.coverage import warn_uncovered_batch
from gridtnp.registry import ConfigError

FINE_LAT, FINE_LON = np.arange(50.0, 58.01, 0.25), np.arange(-10.0, 2.01, 0.25)  # the embedded sample's grid
KELVIN = {"units": "K"}


def blocks(axis: np.ndarray, factor: int, offset: int) -> tuple[np.ndarray, np.ndarray]:
    """Block index of every fine point (first edge ``offset`` points in) and each block's centre, by hand."""
    index = (np.arange(len(axis)) + (factor - offset) % factor) // factor
    return index, np.array([axis[index == i].mean() for i in range(index.max() + 1)])


@pytest.mark.parametrize("offset", [0, 1, 2, 3])
def test_each_cell_averages_its_own_block_partial_edge_blocks_included(offset: int) -> None:
    """4 x 4 blocks of a 0.25 degree axis at every offset (partial first and last blocks), ascending or
    descending, in either longitude convention: each cell's weights are its block's fine points, no more."""
    for axis, name in ((FINE_LAT, "latitude"), (FINE_LON, "longitude")):
        index, centres = blocks(axis, 4, offset)
        for flip_centres in (False, True):
            for flip_fine in (False, True):
                given = centres[::-1] if flip_centres else centres
                given = given % 360 if name == "longitude" and flip_fine else given  # the 0-360 convention too
                fine, fine_index = (axis[::-1], index[::-1]) if flip_fine else (axis, index)
                weights = cell_weights(given, fine, name)
                block = np.arange(len(centres))[::-1] if flip_centres else np.arange(len(centres))
                for i, k in enumerate(block):
                    np.testing.assert_array_equal(weights[i] > 0, fine_index == k, err_msg=f"{name} cell {i}")
    lower, upper = cell_edges(np.array([50.5, 51.5]), np.array([[50.0, 51.0], [52.0, 51.0]]))  # CF bounds as given
    np.testing.assert_array_equal(lower, [50.0, 51.0])
    np.testing.assert_array_equal(upper, [51.0, 52.0])


def climatology_module(clim: np.ndarray) -> NeuralProcessModule:
    """A small station model whose checkpoint record holds ``clim [24, H, W]`` on the sample's fine grid."""
    module = NeuralProcessModule(
        dim_x=2, dim_y={"grid": 1, "stations": 1}, target_source="stations", dim=8,
        grid={"lower": [50.0, -10.0], "upper": [58.0, 2.0], "shape": [4, 4]},
        encoder={"name": "mlp"}, grid_encoder={"name": "pseudo_token"}, processor={"name": "swin", "layers": 1},
        grid_decoder={"name": "knn", "k": 4}, likelihood={"name": "gaussian"},
    )  # fmt: skip
    with torch.no_grad():
        for p in module.parameters():  # initial weights that make the prediction follow the context
            p.add_(0.2 * torch.randn_like(p))
    t2m = {"mean": 280.0, "std": 3.0, "units": "K", "long_name": "2 metre temperature"}
    module.data_metadata = {
        "variables": {"t2m": t2m}, "sources": {"grid": ["t2m"], "stations": ["t2m"]}, "target": ["t2m"],
        "climatology": {"latitude": FINE_LAT, "longitude": FINE_LON, "variables": {"t2m": clim}},
    }  # fmt: skip
    return module


def test_cf_bounds_and_2d_coordinates_give_each_cell_its_own_points() -> None:
    rng = np.random.default_rng(0)
    clim = 280 + rng.standard_normal((24, len(FINE_LAT), len(FINE_LON)))
    module = climatology_module(clim)
    rows, lat = blocks(FINE_LAT, 4, 0)
    cols, lon = blocks(FINE_LON, 4, 0)
    noon = np.datetime64("2019-03-28T12:00")
    grid = xr.DataArray(280 + rng.standard_normal((len(lat), len(lon))), dims=("latitude", "longitude"),
                        coords={"latitude": lat, "longitude": lon, "time": noon}, attrs=KELVIN)  # fmt: skip
    by_hand = np.array([[clim[12][np.ix_(rows == i, cols == j)].mean() for j in range(len(lon))]
                        for i in range(len(lat))])  # fmt: skip
    targets = xr.Dataset(coords={"latitude": [52.0], "longitude": [-3.0]})
    departures, _ = departures_from_reference(module, {"grid": grid}, targets, ("latitude", "longitude"), None)
    np.testing.assert_allclose(grid.values - departures["grid"].values, by_hand, rtol=1e-12)

    # CF bounds: cells narrower than the spacing says (two fine rows and columns each) take those points only.
    ds = grid.to_dataset(name="t2m")
    ds["latitude"].attrs["bounds"], ds["longitude"].attrs["bounds"] = "lat_bnds", "lon_bnds"
    ds["lat_bnds"] = (("latitude", "nv"), np.stack([lat - 0.2, lat + 0.2], -1))
    ds["lon_bnds"] = (("longitude", "nv"), np.stack([lon - 0.2, lon + 0.2], -1))
    stations = xr.DataArray([280.0], dims="station", attrs=KELVIN, coords={
        "latitude": ("station", [52.0]), "longitude": ("station", [-3.0]), "time": noon})  # fmt: skip
    with pytest.warns(UserWarning, match="without a value"):  # cells 0.4 degrees wide, 1 degree apart: gaps
        narrow = predict(module, {"grid": ds, "stations": stations}, targets)
    spacing = predict(module, {"grid": grid, "stations": stations}, targets)
    assert np.abs(narrow["t2m"].values - spacing["t2m"].values).max() > 1e-4  # the bounds reached the model
    narrow_by_hand = np.array([[clim[12][np.ix_(np.abs(FINE_LAT - a) < 0.2, np.abs(FINE_LON - b) < 0.2)].mean()
                                for b in lon] for a in lat])  # fmt: skip
    departures, _ = departures_from_reference(
        module, {"grid": grid}, targets, ("latitude", "longitude"), None,
        {"grid": {"latitude": ds["lat_bnds"].values, "longitude": ds["lon_bnds"].values}},
    )  # fmt: skip
    np.testing.assert_allclose(grid.values - departures["grid"].values, narrow_by_hand, rtol=1e-12)
    with pytest.raises(ConfigError, match="names the bounds variable 'lat_bnds', which the Dataset lacks"):
        predict(module, {"grid": ds.drop_vars("lat_bnds"), "stations": stations}, targets)

    # 2-D coordinates of a rectilinear grid (as from a meshgrid): read as the grid they are, same prediction.
    lat2, lon2 = np.meshgrid(lat, lon, indexing="ij")
    two_d = xr.DataArray(grid.values, dims=("y", "x"), attrs=KELVIN, coords={
        "latitude": (("y", "x"), lat2), "longitude": (("y", "x"), lon2), "time": noon})  # fmt: skip
    same = predict(module, {"grid": two_d, "stations": stations}, targets)
    np.testing.assert_allclose(same["t2m"].values, spacing["t2m"].values, rtol=1e-6)
    # A curvilinear grid: refused where its cells' climatology is needed, with how to pass it.
    bent = two_d.assign_coords(latitude=(("y", "x"), lat2 + 0.01 * lon2))
    with pytest.raises(ConfigError, match=r"curvilinear grid.*regrid it to 1-D latitude and longitude.*point table"):
        predict(module, {"grid": bent, "stations": stations}, targets)


def test_a_trimmed_grid_is_warned_of_in_one_line_and_the_whole_grid_is_not() -> None:
    """The coarse field with its partial edge blocks covers the model's domain: no warning. Trimmed (the last
    row and column of blocks dropped) or with missing blocks near the targets, it does not: one line says so."""
    torch.manual_seed(0)
    module = climatology_module(np.full((24, len(FINE_LAT), len(FINE_LON)), 280.0))
    rng = np.random.default_rng(0)
    fine = xr.DataArray(280 + rng.standard_normal((len(FINE_LAT), len(FINE_LON))), dims=("latitude", "longitude"),
                        coords={"latitude": FINE_LAT, "longitude": FINE_LON,
                                "time": np.datetime64("2019-03-28T12:00")}, attrs=KELVIN)  # fmt: skip
    stations = fine.isel(latitude=[3, 20, 31], longitude=[5, 30, 47]).stack(station=("latitude", "longitude"))
    stations = stations.reset_index("station")
    kept = fine.coarsen(latitude=4, longitude=4, boundary="pad").mean()  # NaN-aware: partial edge blocks kept
    trimmed = fine.coarsen(latitude=4, longitude=4, boundary="trim").mean()
    holed = kept.copy()
    holed[5, 7] = np.nan  # the block around the middle station
    for grid, warned in ((kept, False), (trimmed, True), (holed, True)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            predict(module, {"grid": grid.assign_attrs(KELVIN), "stations": stations}, stations)
            # The same check on tensors, as gridtnp predict makes it (PredictionWriter, first batch).
            lat, lon = np.meshgrid(grid.latitude.values, grid.longitude.values, indexing="ij")
            cells = np.stack([lat, lon], -1)[np.isfinite(grid.values)]  # [G, 2] the cells with a value
            xs = np.stack([stations.latitude.values, stations.longitude.values], -1)
            grid_x = torch.tensor(cells[None], dtype=torch.float32)
            context = {"grid": Observations(grid_x, torch.zeros(1, len(cells), 1))}
            warn_uncovered_batch(module.model, context, Observations(torch.tensor(xs[None], dtype=torch.float32)))
        lines = [str(w.message) for w in caught if "without a value" in str(w.message)]
        assert len(lines) == 2 * int(warned), lines
        if warned:
            assert "\n" not in lines[0] and "of the model's domain" in lines[0]
            assert "predictions lose accuracy" in lines[0]
            assert lines[0] == lines[1]  # the same shares from the tensors
