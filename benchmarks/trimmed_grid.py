"""What a trimmed coarse grid costs through the Python API: held-out RMSE and 90 % coverage of a station checkpoint on
the embedded sample's test hours, the gridded context built by hand with ``coarsen(..., boundary="pad")`` (the
whole box, partial edge blocks kept) and with ``boundary="trim"`` (no southern row, no eastern column), in all and
by a station's distance to the part of the box the trimmed grid leaves uncovered, and the five stations that lose
most.

    python benchmarks/trimmed_grid.py --ckpt runs/demo/checkpoints/last.ckpt            # every 5th test hour
    python benchmarks/trimmed_grid.py --ckpt ... --stride 1 --draws 4 --out trimmed.json

Each draw's context stations are a random ``--context`` of the distinct station grid points in the box (33: about
the middle of the recipe's U[0, 0.3] share of 218); the other stations are scored.
"""

from __future__ import annotations

import argparse
import json
import warnings

import numpy as np
import pandas as pd
import xarray as xr

from gridtnp import NeuralProcessModule
from gridtnp.data import sample_path
from gridtnp.inference import predict

#: Distance bands (degrees) from the fine grid points the trimmed grid leaves uncovered.
BANDS = ((0.0, 0.5), (0.5, 1.5), (1.5, 90.0))


def uncovered_distance(
    lat: np.ndarray, lon: np.ndarray, fine_lat: np.ndarray, fine_lon: np.ndarray, c: int
) -> np.ndarray:
    """Each station's distance (degrees) to the nearest fine row or column that ``coarsen(c, boundary="trim")``
    drops (the last ``len % c`` of each axis)."""
    rows, cols = fine_lat[len(fine_lat) // c * c :], fine_lon[len(fine_lon) // c * c :]
    far = np.full(len(lat), np.inf)
    if len(rows):
        far = np.minimum(far, np.abs(lat[:, None] - rows[None, :]).min(-1))
    if len(cols):
        far = np.minimum(far, np.abs(lon[:, None] - cols[None, :]).min(-1))
    return far


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", required=True, help="a checkpoint of recipes/era5_swin.yaml (make demo)")
    parser.add_argument("--stride", type=int, default=5, help="every stride-th hour of 27-31 March")
    parser.add_argument("--context", type=int, default=33, help="context stations")
    parser.add_argument("--draws", type=int, default=1, help="context draws (seeds seed, seed + 1, ...)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the scores as JSON here")
    args = parser.parse_args()

    module = NeuralProcessModule.load_from_checkpoint(args.ckpt, map_location="cpu")
    data = xr.open_dataset(sample_path())
    t2m = data["t2m"].sel(time=slice("2019-03-27", "2019-03-31")).isel(time=slice(0, None, args.stride)).load()
    table = pd.read_csv(sample_path("hadisd_stations_0p25.csv"))
    table = table[table.latitude.between(50, 58) & table.longitude.between(-10, 2)]
    table = table.drop_duplicates(["latitude", "longitude"])  # one station per grid point, as the DataModule keeps
    lat = xr.DataArray(table.latitude.to_numpy(), dims="station")
    lon = xr.DataArray(table.longitude.to_numpy(), dims="station")
    stations = t2m.sel(latitude=lat, longitude=lon)  # (time, station), kelvin
    truth = stations.transpose("station", "time").values
    far = uncovered_distance(lat.values, lon.values, t2m.latitude.values, t2m.longitude.values, 4)

    sq_err = {"pad": [], "trim": []}  # per draw: [S, T] squared errors, NaN at context stations
    inside = {"pad": [], "trim": []}  # per draw: [S, T] inside the central 90 % interval
    warned: dict[str, set[str]] = {"pad": set(), "trim": set()}
    for draw in range(args.draws):
        order = np.random.default_rng(args.seed + draw).permutation(stations.sizes["station"])
        context = order[: args.context]
        for boundary in ("pad", "trim"):
            coarse = t2m.coarsen(latitude=4, longitude=4, boundary=boundary).mean()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                pred = predict(
                    module,
                    {"grid": coarse, "stations": stations.isel(station=context)},
                    stations.isel(time=0, drop=True),
                    batch_dim="time",
                )
            warned[boundary] |= {str(w.message) for w in caught}
            err = pred["t2m"].transpose("station", "time").values - truth
            z = err / pred["t2m_std"].transpose("station", "time").values
            err[context], z[context] = np.nan, np.nan
            sq_err[boundary].append(err**2)
            inside[boundary].append(np.where(np.isnan(z), np.nan, np.abs(z) < 1.6449))

    result: dict[str, object] = {"hours": int(t2m.sizes["time"]), "context": args.context, "draws": args.draws}
    for boundary in ("pad", "trim"):
        e, c = np.stack(sq_err[boundary]), np.stack(inside[boundary])  # [draws, S, T]
        bands = {}
        for lo, hi in BANDS:
            m = (far >= lo) & (far < hi)
            bands[f"{lo:g}-{hi:g} deg"] = {"stations": int(m.sum()), "rmse": float(np.sqrt(np.nanmean(e[:, m])))}
        result[boundary] = {
            "rmse": float(np.sqrt(np.nanmean(e))),
            "coverage_90": float(np.nanmean(c)),
            "by_distance_to_uncovered": bands,
            "warnings": sorted(warned[boundary]),
        }
    result["trim_cost"] = result["trim"]["rmse"] / result["pad"]["rmse"] - 1.0  # type: ignore[index]
    # The stations that lose most: each one's held-out RMSE on both grids and its share of the rise in squared error.
    mse = {b: np.nanmean(np.stack(sq_err[b]), axis=(0, 2)) for b in ("pad", "trim")}  # [S], over draws and hours
    rise = mse["trim"] - mse["pad"]
    result["largest_losses"] = [
        {
            "latitude": float(lat.values[i]),
            "longitude": float(lon.values[i]),
            "rmse_pad": float(np.sqrt(mse["pad"][i])),
            "rmse_trim": float(np.sqrt(mse["trim"][i])),
            "share_of_rise": float(rise[i] / np.nansum(rise)),
        }
        for i in np.argsort(-np.nan_to_num(rise, nan=-np.inf))[:5]
    ]
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
