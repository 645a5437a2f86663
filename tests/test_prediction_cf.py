"""Predictions as CF: station time series (``featureType: timeSeries``) and maps, from the Python API, written to
NetCDF and plotted in one line each."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
import torch
import xarray as xr

from gridtnp import NeuralProcessModule
from gridtnp.inference import predict

matplotlib.use("Agg")
import matplotlib.pyplot as plt

IDS = ["03772-99999", "03740-99999", "03302-99999", "03017-99999", "03171-99999", "03880-99999"]
ATTRIBUTION = {
    "title": "ERA5 2 m temperature, a hand-made test field",
    "source": "ERA5 reanalysis (Hersbach et al. 2020)",
    "institution": "ECMWF",
    "references": "doi:10.1002/qj.3803",
    "license": "Copernicus licence: free to use with attribution",
}


def station_model() -> NeuralProcessModule:
    """A small untrained station model whose checkpoint record names its target ``t2m`` in kelvin."""
    torch.manual_seed(0)
    module = NeuralProcessModule(
        dim_x=2, dim_y={"grid": 1, "stations": 1}, target_source="stations", dim=16,
        encoder={"name": "mlp"}, grid_encoder={"name": "identity"}, processor={"name": "transformer", "layers": 1},
        grid_decoder={"name": "cross_attention"}, likelihood={"name": "gaussian"},
    )  # fmt: skip
    t2m = {"mean": 280.0, "std": 3.0, "units": "K", "long_name": "2 metre temperature"}
    module.data_metadata = {"variables": {"t2m": t2m}, "sources": {"grid": ["t2m"], "stations": ["t2m"]},
                            "target": ["t2m"]}  # fmt: skip
    return module


def inputs() -> tuple[xr.Dataset, xr.DataArray, xr.DataArray]:
    """A 1 degree field over 4 hours (a Dataset with its attribution), 6 named stations in kelvin, 3 of them
    reporting (the context)."""
    rng = np.random.default_rng(0)
    time = np.array(["2019-03-28T00", "2019-03-28T01", "2019-03-28T02", "2019-03-28T03"], dtype="datetime64[ns]")
    lat, lon = np.arange(50.0, 54.1, 1.0), np.arange(-3.0, 1.1, 1.0)
    field = xr.Dataset(
        {"t2m": (("time", "latitude", "longitude"), 280 + 3 * rng.standard_normal((4, 5, 5)), {"units": "K"})},
        coords={"time": time, "latitude": lat, "longitude": lon}, attrs=ATTRIBUTION,
    )  # fmt: skip
    stations = xr.DataArray(
        280 + 3 * rng.standard_normal((4, 6)), dims=("time", "station"), attrs={"units": "K"},
        coords={"time": time, "station": IDS, "latitude": ("station", rng.uniform(50.5, 53.5, 6)),
                "longitude": ("station", rng.uniform(-2.5, 0.5, 6))},
    )  # fmt: skip
    return field, stations, stations.isel(station=slice(0, 3))


def test_station_predictions_are_a_cf_time_series(tmp_path: Path) -> None:
    module = station_model()
    field, stations, reporting = inputs()
    targets = stations.isel(time=0, drop=True)  # every station, reporting or not
    out = predict(module, {"grid": field["t2m"], "stations": reporting}, targets, batch_dim="time", attrs=field.attrs)
    assert out.attrs["Conventions"] == "CF-1.10" and out.attrs["featureType"] == "timeSeries"
    assert out["t2m"].dims == ("station", "time") and out["t2m"].dtype == np.float32
    assert list(out.station.values) == IDS and out["station"].attrs["cf_role"] == "timeseries_id"
    assert out["t2m"].attrs["standard_name"] == "air_temperature" and out["t2m"].attrs["units"] == "K"
    assert out["t2m"].attrs["ancillary_variables"] == "t2m_std"
    std = out["t2m_std"].attrs
    assert std["standard_name"] == "air_temperature standard_error" and std["units"] == "K" and std["long_name"]
    for axis, units in (("latitude", "degrees_north"), ("longitude", "degrees_east")):
        assert out[axis].dims == ("station",) and out[axis].attrs == {
            "standard_name": axis, "long_name": axis, "units": units}  # fmt: skip
    # The first three stations are the context: flagged, with the flag's meaning beside its values.
    flags = out["is_context"]
    assert flags.dtype == np.int8 and list(flags.attrs["flag_values"]) == [0, 1]
    assert flags.attrs["flag_meanings"] == "held_out context"
    np.testing.assert_array_equal(flags.values, np.repeat([[1], [1], [1], [0], [0], [0]], 4, axis=1))
    # The input's attribution carried over; the source says what made the file and from what.
    for key in ("institution", "references", "license"):
        assert out.attrs[key] == ATTRIBUTION[key]
    source = out.attrs["source"]
    assert source.startswith("gridtnp.inference.predict") and ATTRIBUTION["source"] in source

    path = tmp_path / "pred.nc"
    out.to_netcdf(path)
    with xr.open_dataset(path, decode_times=False) as raw:
        assert raw["time"].attrs["units"].startswith("hours since") and raw["time"].attrs["calendar"] == "standard"
    with xr.open_dataset(path) as ds:
        xr.testing.assert_allclose(ds["t2m"], out["t2m"])
    # One line each: one station's series, one hour's map of the stations.
    lines = xr.open_dataset(path).t2m.sel(station="03772-99999").plot()
    assert len(lines[0].get_xdata()) == 4
    plt.close("all")
    xr.open_dataset(path).isel(time=0).plot.scatter(x="longitude", y="latitude", hue="t2m")
    plt.close("all")


def test_a_map_target_gives_a_gridded_dataset(tmp_path: Path) -> None:
    module = station_model()
    field, _, reporting = inputs()
    targets = xr.Dataset(coords={"latitude": np.linspace(50, 54, 9), "longitude": np.linspace(-3, 1, 9)})
    out = predict(module, {"grid": field["t2m"], "stations": reporting}, targets, batch_dim="time", attrs=field.attrs)
    assert out["t2m"].dims == ("time", "latitude", "longitude") and out["t2m"].dtype == np.float32
    assert "featureType" not in out.attrs and "is_context" not in out and out.attrs["Conventions"] == "CF-1.10"
    assert out["latitude"].attrs["standard_name"] == "latitude" and out.attrs["license"] == ATTRIBUTION["license"]
    out.to_netcdf(tmp_path / "map.nc")
    xr.open_dataset(tmp_path / "map.nc").t2m.isel(time=0).plot()  # one hour's map, in one line
    plt.close("all")


def test_stations_without_identifiers_are_named_by_their_location() -> None:
    """Stations given without ids get their ISO 6709 location; one time (no batch_dim) is a point feature."""
    module = station_model()
    field, stations, reporting = inputs()
    anonymous = stations.isel(time=0).drop_vars("station")
    out = predict(module, {"grid": field.isel(time=0), "stations": reporting.isel(time=0)}, anonymous)
    assert out.attrs["license"] == ATTRIBUTION["license"]  # from the context Dataset's own attributes
    lat, lon = anonymous.latitude.values[0], anonymous.longitude.values[0]
    assert out.station.values[0] == f"{lat:+07.3f}{lon:+08.3f}" and len(out.station.values[0]) == 15
    assert out.attrs["featureType"] == "point" and out["time"].ndim == 0  # the context's time, kept
    assert out["t2m"].dims == ("station",)


def test_targets_from_a_table_of_station_reports_keep_their_ids(tmp_path: Path) -> None:
    """Targets given as a station observation file (read by ``read_observations``): each station once, its id and
    elevation carried through to the output."""
    from gridtnp.data.observations.table import read_observations

    module = station_model()
    field, stations, reporting = inputs()
    rows = ["station_id,time,latitude,longitude,elevation,t2m"]
    for i, sid in enumerate(IDS[:4]):
        lat, lon = stations.latitude.values[i], stations.longitude.values[i]
        rows += [f"{sid},2019-03-28T{h:02d}:00,{lat:.4f},{lon:.4f},{10 * i},{281 + h}" for h in range(2)]
    (tmp_path / "obs.csv").write_text("\n".join(rows) + "\n")
    table, problems = read_observations(tmp_path / "obs.csv")
    assert not problems
    out = predict(module, {"grid": field["t2m"], "stations": reporting}, table, batch_dim="time")
    assert sorted(out.station.values) == sorted(IDS[:4]) and out["t2m"].dims == ("station", "time")
    assert out["elevation"].attrs["standard_name"] == "surface_altitude" and out["elevation"].attrs["units"] == "m"
    np.testing.assert_allclose(out["elevation"].sel(station=IDS[2]), 20.0)
