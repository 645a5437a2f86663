"""What kriging a per-station regression's residuals can add, by the correlation it uses: closed-form fits.

    python benchmarks/era5_residual_kriging.py --json benchmarks/results/era5_residual_kriging_cpu.json

The regression is ``residual.regression``'s family fitted in closed form (``era5_mos_layouts.py``'s last row: shape
statistics up to cubic at 0.75 degree, coefficients quadratic in the station's place in its block, one ridge fit
per station over all 16 block offsets, on departures from the training dates' hourly climatology). Its test-day
predictions at the training layout are then corrected, hour by hour, by kriging the residuals observed at a random
U[0, 0.3] share of the stations (the station task's contexts; the same draws for every row, seed fixed), scored at
the other stations:

- none: the regression alone;
- stationary: a squared-exponential correlation on latitude/longitude (lengthscale and nugget chosen on the
  validation days from a small grid), as ``mos_kriging`` uses;
- empirical: each station pair's covariance of the regression's out-of-fold residuals over the training days
  (three folds of seven days, so the residuals are those of days the fit did not see), tapered by a 3 degree
  squared exponential; the correlation a model with enough place features could learn. Nugget chosen on the
  validation days;
- empirical by hour of day: the same, from the training hours within +-1, 3 or 6 hours of the hour's UTC time of
  day (window and nugget chosen on the validation days): a correlation that follows the diurnal cycle.

RMSE in kelvin over held-out stations and test hours; then the regression's test RMSE over all stations by
three-hour window of the day.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import xarray as xr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from era5_mos_baseline import SPLITS, load
from era5_mos_layouts import FACTOR, regressors, ridge
from harness import git_commit, run_record

from gridtnp.data.layout import normalise
from gridtnp.data.sample import ERA5_SAMPLE, sample_path

TAPER = 3.0  # degrees


def krige(
    pred: np.ndarray,
    truth: np.ndarray,
    hours: np.ndarray,
    cov: np.ndarray,
    nugget: float,
    seed: int,
    hour_of_day: np.ndarray | None = None,
) -> float:
    """Held-out RMSE of ``pred [S, T]`` after kriging its residuals at a U[0, 0.3] share of stations, per hour;
    ``cov [S, S]``, or ``[24, S, S]`` indexed by each hour's ``hour_of_day [T]``."""
    rng = np.random.default_rng(seed)
    residual = truth - pred
    sse, count = 0.0, 0
    for t in hours:
        c_t = cov if cov.ndim == 2 else cov[hour_of_day[t]]
        scale = float(np.mean(np.diag(c_t)))
        n = int(rng.uniform(0, 0.3) * len(pred))
        order = rng.permutation(len(pred))
        c, h = order[:n], order[n:]
        estimate = pred[h, t]
        if n:
            a = c_t[np.ix_(c, c)] + nugget * scale * np.eye(n)
            estimate = estimate + c_t[np.ix_(h, c)] @ np.linalg.solve(a, residual[c, t])
        sse += float(np.sum((truth[h, t] - estimate) ** 2))
        count += len(h)
    return float(np.sqrt(sse / count))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None, help="write the rows and the run's record here")
    args = parser.parse_args()
    field, hour, day, cells = load()
    ds = normalise(xr.open_dataset(sample_path(ERA5_SAMPLE)))
    coords = (ds["latitude"].values, ds["longitude"].values)
    xs = np.stack([coords[0][cells[:, 0]], coords[1][cells[:, 1]]], -1)
    value = field[:, cells[:, 0], cells[:, 1]].T  # [S, T]
    split = {k: np.flatnonzero((day >= lo) & (day <= hi)) for k, (lo, hi) in SPLITS.items()}
    train = split["train"]
    hod = np.round(hour).astype(int) % 24
    climatology = np.stack([field[train][hod[train] == h].mean(0) for h in range(24)])[hod]
    anomaly = field - climatology
    y = value - climatology[:, cells[:, 0], cells[:, 1]].T  # station departures [S, T]
    offsets = [(a, b) for a in range(FACTOR) for b in range(FACTOR)]
    built = {o: regressors(anomaly, xs, coords, o, "shape", 0.75, 3, 2) for o in offsets}

    def fit_predict(rows: np.ndarray) -> np.ndarray:
        coef = ridge(
            np.concatenate([built[o][1][:, rows] for o in offsets], 1),
            np.concatenate([(y - built[o][0])[:, rows] for o in offsets], 1),
            1e-2,
        )
        base, x = built[(0, 0)]
        return base + np.einsum("stf,sf->st", x, coef)

    pred = fit_predict(train)
    out_of_fold = np.zeros_like(y)
    for lo, hi in ((1, 7), (8, 14), (15, 21)):
        held = train[(day[train] >= lo) & (day[train] <= hi)]
        out_of_fold[:, held] = fit_predict(np.setdiff1d(train, held))[:, held]
    residual = (y - out_of_fold)[:, train]
    d2 = ((xs[:, None] - xs[None]) ** 2).sum(-1)
    variance = float(np.mean(residual**2))
    taper = np.exp(-0.5 * d2 / TAPER**2)
    empirical = residual @ residual.T / residual.shape[1] * taper

    def by_hour(window: int) -> np.ndarray:
        """``[24, S, S]``: the tapered covariance of the training hours within ``window`` hours of each hour."""
        out = []
        for h in range(24):
            near = residual[:, np.minimum((hod[train] - h) % 24, (h - hod[train]) % 24) <= window]
            out.append(near @ near.T / near.shape[1] * taper)
        return np.stack(out)

    def best(covs: dict[str, np.ndarray]) -> tuple[str, float, float]:
        """The (correlation, nugget) with the best validation RMSE, and its test RMSE."""
        scores = {
            (name, nugget): krige(pred, y, split["val"], cov, nugget, 1, hod)
            for name, cov in covs.items()
            for nugget in (0.01, 0.03, 0.1, 0.3, 1.0)
        }
        name, nugget = min(scores, key=scores.get)
        test = krige(pred, y, split["test"], covs[name], nugget, 0, hod)
        return f"{name}, nugget {nugget}", scores[name, nugget], test

    stationary = {f"lengthscale {ell}": variance * np.exp(-0.5 * d2 / ell**2) for ell in (0.1, 0.2, 0.4, 0.8)}
    rows = [
        {
            "correlation": "none",
            "chosen": "",
            "val": krige(pred, y, split["val"], np.eye(len(xs)), 1e9, 1),
            "test": krige(pred, y, split["test"], np.eye(len(xs)), 1e9, 0),
        },
    ]
    hourly = {f"+-{w} h, tapered 3 degrees": by_hour(w) for w in (1, 3, 6)}
    for label, covs in (
        ("stationary", stationary),
        ("empirical", {"tapered 3 degrees": empirical}),
        ("empirical by hour of day", hourly),
    ):
        chosen, val, test = best(covs)
        rows.append({"correlation": label, "chosen": chosen, "val": val, "test": test})
    print(f"Closed-form regression ({len(xs)} stations) and kriging of its residuals, commit {git_commit()}")
    print("| correlation | chosen on the validation days | validation held-out RMSE K | test held-out RMSE K |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['correlation']} | {r['chosen']} | {r['val']:.3f} | {r['test']:.3f} |")
    test = split["test"]
    by_hour = {  # the regression alone, all stations: where in the day its errors are
        f"{h:02d}-{h + 2:02d} UTC": float(
            np.sqrt(np.mean((pred - y)[:, test[(hod[test] >= h) & (hod[test] <= h + 2)]] ** 2))
        )
        for h in range(0, 24, 3)
    }
    print("Regression alone, test RMSE K by UTC hour:", ", ".join(f"{k} {v:.3f}" for k, v in by_hour.items()))
    if args.json:
        record = {**run_record(torch.device("cpu")), "rows": rows, "regression_rmse_by_utc_hour": by_hour}
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
