"""What a trimmed coarse grid costs through the Python API: held-out RMSE and 90 % coverage of a station checkpoint on
the embedded sample's test hours, the gridded context built by hand with ``coarsen(..., boundary="pad")`` (the
whole box, partial edge blocks kept) and with ``boundary="trim"`` (no southern row, no eastern column).

    python benchmarks/trimmed_grid.py --ckpt runs/demo/checkpoints/last.ckpt            # every 5th test hour
    python benchmarks/trimmed_grid.py --ckpt ... --stride 1 --out trimmed.json          # every test hour

The context stations are a fixed random ``--context`` of the distinct station grid points in the box (33: about
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


def scores(pred: xr.Dataset, truth: xr.DataArray, held: np.ndarray) -> dict[str, float]:
    """Held-out RMSE (K) and share of held-out values inside the central 90 % interval."""
    mean = pred["t2m"].transpose("station", "time").values[held]
    std = pred["t2m_std"].transpose("station", "time").values[held]
    err = mean - truth.transpose("station", "time").values[held]
    return {"rmse": float(np.sqrt(np.mean(err**2))), "coverage_90": float(np.mean(np.abs(err / std) < 1.6449))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", required=True, help="a checkpoint of recipes/era5_swin.yaml (make demo)")
    parser.add_argument("--stride", type=int, default=5, help="every stride-th hour of 27-31 March")
    parser.add_argument("--context", type=int, default=33, help="context stations")
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
    order = np.random.default_rng(args.seed).permutation(stations.sizes["station"])
    context, held = order[: args.context], np.sort(order[args.context :])

    result: dict[str, object] = {"hours": int(t2m.sizes["time"]), "context": len(context), "held_out": len(held)}
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
        result[boundary] = {**scores(pred, stations, held), "warnings": sorted({str(w.message) for w in caught})}
    result["trim_cost"] = result["trim"]["rmse"] / result["pad"]["rmse"] - 1.0  # type: ignore[index]
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
