"""A statistical-downscaling reference for the ERA5 station task: per-station linear regression (MOS) on coarse blocks.

    python benchmarks/era5_mos_baseline.py --layout train=4:0,0 --layout shifted=4:1,0 --layout coarse3=3:0,0

What a meteorologist would fit before any neural process: for each station, a ridge regression of (station value -
its coarse block's value) on the ``(2r + 1)^2`` coarse blocks around it (standardised) and two diurnal harmonics,
fitted on the training days (2019-03-01..21), its Gaussian std per station fitted on the validation days (22..26),
scored on the test days (27..31) of the embedded sample at the 218 distinct HadISD stations in the box. It uses no
station context (every station is "held out"), so it is a bar for the held-out RMSE. It is tied to its layout:
``fit on layout`` refits it on each layout's blocks; ``fit on train layout`` applies the training layout's
coefficients to another layout's blocks, as a model that learned one lattice would. Same layout syntax and
unweighted station averages as ``era5_skill.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import git_commit

from gridtnp.data.era5.blocks import BlockLayout
from gridtnp.data.layout import normalise
from gridtnp.data.sample import ERA5_SAMPLE, STATIONS_SAMPLE, sample_path

SPLITS = {"train": (1, 21), "val": (22, 26), "test": (27, 31)}  # days of March 2019, as the DataModule's defaults


def load() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Fine field ``[T, H, W]`` (latitudes ascending, as the store), hour ``[T]``, day ``[T]``, cells ``[S, 2]``."""
    ds = normalise(xr.open_dataset(sample_path(ERA5_SAMPLE)))
    field = ds["t2m"].values.astype(np.float64)
    time = pd.DatetimeIndex(ds["time"].values)
    lat, lon = ds["latitude"].values, ds["longitude"].values
    st = pd.read_csv(sample_path(STATIONS_SAMPLE))
    inside = st.latitude.between(lat.min(), lat.max()) & st.longitude.between(lon.min(), lon.max())
    rows = np.abs(st.latitude.values[inside, None] - lat[None]).argmin(1)
    cols = np.abs(st.longitude.values[inside, None] - lon[None]).argmin(1)
    cells = np.unique(np.stack([rows, cols], 1), axis=0)
    return field, time.hour.to_numpy() + time.minute.to_numpy() / 60, time.day.to_numpy(), cells


def features(field: np.ndarray, hour: np.ndarray, cells: np.ndarray, factor: int, offset: tuple[int, int], r: int):
    """Regressors ``[S, T, F]`` (1, diurnal harmonics, neighbouring blocks) and each station's own block ``[S, T]``."""
    t, h, w = field.shape
    layout = BlockLayout(np.array([factor]), np.array([offset]), (h, w))
    blocks = layout.means(field.reshape(t, h * w).T[None])[0]  # [blocks, T]
    label = layout.labels[0].reshape(h, w)[cells[:, 0], cells[:, 1]]  # [S]
    brows, bcols = int(layout.block_rows[0]), int(layout.block_cols[0])
    br, bc = label // bcols, label % bcols
    steps = np.arange(-r, r + 1)
    nr = np.clip(br[:, None, None] + steps[None, :, None], 0, brows - 1)
    nc = np.clip(bc[:, None, None] + steps[None, None, :], 0, bcols - 1)
    neighbours = blocks[(nr * bcols + nc).reshape(len(cells), -1)]  # [S, (2r+1)^2, T]
    angle = 2 * math.pi * hour / 24
    diurnal = np.stack([np.ones_like(angle), np.sin(angle), np.cos(angle), np.sin(2 * angle), np.cos(2 * angle)], -1)
    x = np.concatenate([np.broadcast_to(diurnal, (len(cells), t, 5)), neighbours.transpose(0, 2, 1)], -1)
    return x, blocks[label]


def fit(x: np.ndarray, y: np.ndarray, rows: np.ndarray, ridge: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-station ridge coefficients ``[S, F]`` on the time steps ``rows``, with the standardisation they need."""
    mu = x[:, rows, 5:].mean(1, keepdims=True)
    sd = x[:, rows, 5:].std(1, keepdims=True) + 1e-6
    xs = np.concatenate([x[..., :5], (x[..., 5:] - mu) / sd], -1)
    a = np.einsum("stf,stg->sfg", xs[:, rows], xs[:, rows])
    penalty = ridge * np.eye(x.shape[-1])
    penalty[0, 0] = 0.0  # no shrinkage of the intercept
    coef = np.linalg.solve(a + penalty, np.einsum("stf,st->sf", xs[:, rows], y[:, rows])[..., None])[..., 0]
    return coef, mu, sd


def predict(x: np.ndarray, coef: np.ndarray, mu: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """Predicted (station - own block) ``[S, T]``."""
    xs = np.concatenate([x[..., :5], (x[..., 5:] - mu) / sd], -1)
    return np.einsum("stf,sf->st", xs, coef)


def scores(y: np.ndarray, mean: np.ndarray, std: np.ndarray) -> dict[str, float]:
    """RMSE, 90 % coverage, mean z^2 and log-likelihood (nats per target), in kelvin, over ``[S, T]``."""
    z = (y - mean) / std
    return {
        "rmse": float(np.sqrt(np.mean((y - mean) ** 2))),
        "coverage_90": float(np.mean(np.abs(z) <= 1.6448536269514722)),
        "mean_z2": float(np.mean(z**2)),
        "loglik": float(np.mean(-0.5 * z**2 - np.log(std) - 0.5 * math.log(2 * math.pi))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[1], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--layout", action="append", default=None, help="NAME=C:LAT,LON (repeatable)")
    parser.add_argument("--radius", type=int, default=1, help="neighbouring blocks each side (1: 3 x 3 blocks)")
    parser.add_argument("--ridge", type=float, default=1.0, help="ridge penalty on the standardised block values")
    parser.add_argument("--json", type=Path, default=None, help="append one JSON line per row")
    args = parser.parse_args()
    layouts = {}
    for item in args.layout or ["train=4:0,0", "shifted=4:1,0", "coarse3=3:0,0"]:
        name, _, spec = item.partition("=")
        factor, _, offset = spec.partition(":")
        layouts[name] = (int(factor), tuple(int(o) for o in offset.split(",")))
    field, hour, day, cells = load()
    value = field[:, cells[:, 0], cells[:, 1]].T  # [S, T]
    split = {k: np.flatnonzero((day >= lo) & (day <= hi)) for k, (lo, hi) in SPLITS.items()}
    built = {name: features(field, hour, cells, c, o, args.radius) for name, (c, o) in layouts.items()}
    first = next(iter(layouts))
    print(f"MOS baseline: {len(cells)} stations, radius {args.radius}, ridge {args.ridge}, commit {git_commit()}")
    print("| layout | fitted on | test RMSE K | coarse block RMSE K | coverage 90 | mean z^2 | loglik (nats, K) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, (x, own) in built.items():
        for fitted_on in dict.fromkeys([name, first]):
            fx, fown = built[fitted_on]
            coef, mu, sd = fit(fx, value - fown, split["train"], args.ridge)
            mean = own + predict(x, coef, mu, sd)
            val_mean = fown + predict(fx, coef, mu, sd)
            std = np.sqrt(np.mean((value - val_mean)[:, split["val"]] ** 2, axis=1, keepdims=True))  # [S, 1]
            test = split["test"]
            row = scores(value[:, test], mean[:, test], np.broadcast_to(std, mean[:, test].shape))
            coarse = float(np.sqrt(np.mean((value - own)[:, test] ** 2)))
            print(
                f"| {name} {layouts[name][0]}:{layouts[name][1][0]},{layouts[name][1][1]} | {fitted_on} | "
                f"{row['rmse']:.3f} | {coarse:.3f} | {row['coverage_90']:.3f} | {row['mean_z2']:.2f} | "
                f"{row['loglik']:.3f} |"
            )
            if args.json:
                with args.json.open("a") as f:
                    record = {"layout": name, "fitted_on": fitted_on, "coarse_rmse": coarse, **row}
                    f.write(json.dumps({**record, "radius": args.radius, "ridge": args.ridge}) + "\n")


if __name__ == "__main__":
    main()
