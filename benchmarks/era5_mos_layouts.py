"""What a per-station linear regression keeps when the coarse blocks move: closed-form fits for the ERA5 station task.

    python benchmarks/era5_mos_layouts.py

For each station of the embedded sample, a ridge regression of (station value - interpolation of its 9 nearest
coarse blocks) on regressors built from those blocks, fitted on the training days (2019-03-01..21) and scored on the
test days (27..31) at the evaluation layout (4 x 4 blocks from the store's first cell). Two fits per row: on that one
layout (as MOS is fitted), and over all 16 block offsets at once (as the neural model trains, with
``coarsen_offset: random``), which asks for one set of coefficients per station that holds wherever the block edges
fall. Rows: the 9 block values themselves (as departures from the interpolation: MOS's regressors), the kernel-
weighted gradients and curvatures of the coarse field around the station (``residual.regression``'s statistics, at
the interpolation's 0.5 degree lengthscale and at 0.75 degree), on values or on departures from the training dates'
hourly climatology (``climatology: true``), with the cubic terms (``degree: 3``) and with every coefficient a
quadratic in the station's offset from its nearest block centre (``position: 2``). The interpolation is the
Gaussian-weighted mean of the 9 blocks at a 0.5 degree lengthscale. Test RMSE in kelvin over all stations and test
hours.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import xarray as xr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from era5_mos_baseline import SPLITS, load
from harness import git_commit

from gridtnp.data.era5.blocks import BlockLayout
from gridtnp.data.layout import normalise
from gridtnp.data.sample import ERA5_SAMPLE, sample_path
from gridtnp.nn.monomials import shape_basis

FACTOR, NEIGHBOURS, INTERPOLATION_LENGTHSCALE = 4, 9, 0.5


def regressors(
    field: np.ndarray,
    xs: np.ndarray,
    coords: tuple[np.ndarray, np.ndarray],
    offset: tuple[int, int],
    kind: str,
    lengthscale: float,
    degree: int = 2,
    position: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """The interpolation ``[S, T]`` of each station's 9 nearest blocks and the regressors ``[S, T, F]`` (with a 1).

    ``degree`` and ``position`` as ``residual.regression``'s: the shape statistics' monomials up to ``degree``, and
    every regressor times the monomials up to ``position`` of the station's offset from its nearest block centre.
    """
    t, h, w = field.shape
    layout = BlockLayout(np.array([FACTOR]), np.array([offset]), (h, w))
    blocks = layout.means(field.reshape(t, h * w).T[None])[0]  # [blocks, T]
    centres = layout.coordinates(*coords)[0][: blocks.shape[0]]  # [blocks, 2]
    d2 = ((xs[:, None] - centres[None]) ** 2).sum(-1)
    near = np.argsort(d2, 1)[:, :NEIGHBOURS]  # [S, K]
    values = blocks[near]  # [S, K, T]
    offsets = centres[near] - xs[:, None]  # [S, K, 2] in degrees

    def weights(scale: float) -> np.ndarray:
        wgt = np.exp(-0.5 * (offsets**2).sum(-1) / scale**2)
        return wgt / wgt.sum(1, keepdims=True)  # [S, K]

    base = np.einsum("sk,skt->st", weights(INTERPOLATION_LENGTHSCALE), values)
    if kind == "blocks":
        x = (values - base[:, None]).transpose(0, 2, 1)  # [S, T, K]
    else:
        o = offsets / lengthscale
        phi = shape_basis(torch.from_numpy(o), degree).numpy()  # [S, K, P]
        wgt = weights(lengthscale)
        mean = np.einsum("sk,skt->st", wgt, values)
        x = np.einsum("sk,skp,skt->stp", wgt, phi, values - mean[:, None])  # [S, T, P]
    x = np.concatenate([np.ones_like(x[..., :1]), x], -1)
    if position:
        u = torch.from_numpy(-offsets[:, 0] / lengthscale)  # the nearest block centre comes first
        psi = np.concatenate([np.ones((len(xs), 1)), shape_basis(u, position).numpy()], -1)  # [S, Q]
        x = (x[..., None] * psi[:, None, None]).reshape(*x.shape[:2], -1)
    return base, x


def ridge(x: np.ndarray, y: np.ndarray, penalty: float) -> np.ndarray:
    """Per-station ridge coefficients ``[S, F]`` of ``y [S, T]`` on ``x [S, T, F]``."""
    a = np.einsum("stf,stg->sfg", x, x) + penalty * np.eye(x.shape[-1])
    return np.linalg.solve(a, np.einsum("stf,st->sf", x, y)[..., None])[..., 0]


def main() -> None:
    field, hour, day, cells = load()
    ds = normalise(xr.open_dataset(sample_path(ERA5_SAMPLE)))
    coords = (ds["latitude"].values, ds["longitude"].values)
    xs = np.stack([coords[0][cells[:, 0]], coords[1][cells[:, 1]]], -1)  # station grid points [S, 2]
    value = field[:, cells[:, 0], cells[:, 1]].T  # [S, T]
    split = {k: np.flatnonzero((day >= lo) & (day <= hi)) for k, (lo, hi) in SPLITS.items()}
    train, test = split["train"], split["test"]
    hod = np.round(hour).astype(int) % 24
    climatology = np.stack([field[train][hod[train] == h].mean(0) for h in range(24)])[hod]  # [T, H, W]
    rows = [
        ("the 9 block values (as departures from the interpolation)", "blocks", 0.5, False),
        ("kernel-weighted gradients and curvatures, 0.5 degree", "shape", 0.5, False),
        ("the same, on departures from the hourly climatology", "shape", 0.5, True),
        ("the same, shape weighted at 0.75 degree", "shape", 0.75, True),
        ("the same, with the cubic terms (`degree: 3`)", "shape", 0.75, True, 3),
        (
            "the same, coefficients quadratic in the station's place in its block (`position: 2`)",
            "shape",
            0.75,
            True,
            3,
            2,
        ),
    ]
    offsets = [(a, b) for a in range(FACTOR) for b in range(FACTOR)]
    print(f"Per-station ridge regressions, {len(cells)} stations, test RMSE (K), commit {git_commit()}")
    print("| regressors | fitted on one layout | fitted over all 16 offsets |")
    print("| --- | --- | --- |")
    for name, kind, lengthscale, anomalies, *powers in rows:
        source = field - climatology if anomalies else field
        reference = climatology[:, cells[:, 0], cells[:, 1]].T if anomalies else 0.0
        built = {o: regressors(source, xs, coords, o, kind, lengthscale, *powers) for o in offsets}
        target = {o: value - reference - base for o, (base, _) in built.items()}
        base, x = built[(0, 0)]
        one = ridge(x[:, train], target[(0, 0)][:, train], 1e-3)
        pooled = ridge(
            np.concatenate([built[o][1][:, train] for o in offsets], 1),
            np.concatenate([target[o][:, train] for o in offsets], 1),
            1e-2,
        )
        scores = []
        for coef in (one, pooled):
            mean = reference + base + np.einsum("stf,sf->st", x, coef)
            scores.append(float(np.sqrt(np.mean((mean - value)[:, test] ** 2))))
        print(f"| {name} | {scores[0]:.3f} | {scores[1]:.3f} |")


if __name__ == "__main__":
    main()
