"""The classical baselines: ``mos`` against numpy's least squares, ``mos_kriging`` against the GP posterior in closed
form, and each recipe through ``gridtnp fit`` on the embedded sample."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from gridtnp.cli import main
from gridtnp.nn.grid_decoders.mos import MOSDecoder, MOSKrigingDecoder, gp_posterior, ridge_per_place
from gridtnp.nn.tokens import Latent

ROOT = Path(__file__).resolve().parents[2]
PLACES = {"lower": [0.0, 0.0], "upper": [1.0, 2.0], "shape": [2, 3]}  # 6 places, 1 apart
GRID_SOURCE = torch.tensor([[i, j] for i in range(-2, 4) for j in range(-2, 5)], dtype=torch.float32)  # 42 blocks


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def context_set(values: torch.Tensor, stations: torch.Tensor | None = None, station_values: torch.Tensor | None = None):
    """The ``identity`` pipeline's state: the grid source (id 0) at ``GRID_SOURCE`` and optional stations (id 1)."""
    b = values.shape[0]
    x, z = GRID_SOURCE.expand(b, -1, -1), values
    source = torch.zeros(b, len(GRID_SOURCE), dtype=torch.long)
    if stations is not None:
        x = torch.cat([x, stations], 1)
        z = torch.cat([z, station_values], 1)
        source = torch.cat([source, torch.ones(b, stations.shape[1], dtype=torch.long)], 1)
    mask = torch.ones(z.shape, dtype=torch.bool)
    return [Latent(z.unsqueeze(-1), mask=mask, x=x, source=source)]


def test_ridge_per_place_is_numpy_least_squares():
    rng = np.random.default_rng(0)
    x, place = rng.normal(size=(60, 4)), rng.integers(0, 3, 60)
    y = rng.normal(size=60)
    fitted = ridge_per_place(torch.tensor(x), torch.tensor(y), torch.tensor(place), 3, ridge=0.0).numpy()
    ridged = ridge_per_place(torch.tensor(x), torch.tensor(y), torch.tensor(place), 3, ridge=2.0).numpy()
    for p in range(3):
        xp, yp = x[place == p], y[place == p]
        np.testing.assert_allclose(fitted[p], np.linalg.lstsq(xp, yp, rcond=None)[0], rtol=1e-8, atol=1e-10)
        closed = np.linalg.solve(xp.T @ xp + 2.0 * np.eye(4), xp.T @ yp)
        np.testing.assert_allclose(ridged[p], closed, rtol=1e-8, atol=1e-10)


def test_mos_fitted_by_the_training_loss_is_least_squares_per_place():
    """Adam on the Gaussian NLL (what ``gridtnp fit`` runs) reaches each place's least-squares coefficients."""
    torch.manual_seed(0)
    decoder = MOSDecoder(PLACES, sources=["grid", "stations"], radius=1, spacing=1.0)
    places = torch.tensor([[i, j] for i in range(2) for j in range(3)], dtype=torch.float32)  # one target per place
    tasks = 64
    xt = places.expand(tasks, -1, -1)
    states = context_set(torch.randn(tasks, len(GRID_SOURCE)))
    x, z, mask, source = decoder.context(states)
    features = decoder.features(x, z, mask, source, xt)  # [tasks, 6, 10]
    truth = torch.randn(6, features.shape[-1])
    y = (features * truth).sum(-1) + 0.3 * torch.randn(tasks, 6)
    optimiser = torch.optim.Adam(decoder.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, 400)
    for _ in range(400):
        optimiser.zero_grad()
        out = decoder(states, torch.zeros(tasks, 6, 2), xt)
        dist = torch.distributions.Normal(out[..., 0], out[..., 1].mul(0.5).exp())
        (-dist.log_prob(y).mean()).backward()
        optimiser.step()
        schedule.step()
    fitted = decoder.coef.table.detach()[decoder.coef.index(places[None])[0]].double().numpy()
    f, t = features.double().numpy(), y.double().numpy()
    for p in range(6):
        np.testing.assert_allclose(fitted[p], np.linalg.lstsq(f[:, p], t[:, p], rcond=None)[0], atol=1e-3)
    residual = t - np.einsum("tpf,pf->tp", f, fitted)
    np.testing.assert_allclose(
        decoder.log_var.table.detach()[decoder.coef.index(places[None])[0], 0].exp().numpy(),
        np.mean(residual**2, 0),
        rtol=2e-2,
    )


def matern32(a: np.ndarray, b: np.ndarray, lengthscale: float, outputscale: float) -> np.ndarray:
    """``s^2 (1 + sqrt(3) d / l) exp(-sqrt(3) d / l)`` between the rows of ``a [N, d]`` and ``b [M, d]``."""
    r = math.sqrt(3) * np.linalg.norm(a[:, None] - b[None], axis=-1) / lengthscale
    return outputscale * (1 + r) * np.exp(-r)


def closed_form(xc, rc, xt, lengthscale, outputscale, noise):
    """GP posterior mean ``K_tc (K_cc + s^2 I)^-1 r`` and variance ``k_tt - K_tc (K_cc + s^2 I)^-1 K_ct``."""
    kcc = matern32(xc, xc, lengthscale, outputscale) + noise * np.eye(len(xc))
    ktc = matern32(xt, xc, lengthscale, outputscale)
    return ktc @ np.linalg.solve(kcc, rc), outputscale - np.einsum("tc,ct->t", ktc, np.linalg.solve(kcc, ktc.T))


def test_gp_posterior_is_the_closed_form_and_ignores_padding():
    rng = np.random.default_rng(1)
    decoder = MOSKrigingDecoder(PLACES, sources=["grid", "stations"], lengthscale=0.7, outputscale=0.8, noise=0.05)
    xc, rc, xt = rng.uniform(0, 2, (2, 9, 2)), rng.normal(size=(2, 9)), rng.uniform(-1, 3, (2, 5, 2))
    mask = np.ones((2, 9), dtype=bool)
    mask[1, 6:] = False  # task 1 has 6 real points and 3 padded ones (anything in them)
    mean, var = gp_posterior(
        decoder.kernel,
        decoder.log_noise.exp().double(),
        torch.tensor(xc),
        torch.tensor(rc),
        torch.tensor(mask),
        torch.tensor(xt),
    )
    for b in range(2):
        m, v = closed_form(xc[b, mask[b]], rc[b, mask[b]], xt[b], 0.7, 0.8, 0.05)
        np.testing.assert_allclose(mean[b].detach().numpy(), m, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(var[b].detach().numpy(), v, rtol=1e-5, atol=1e-6)


def test_mos_kriging_adds_the_posterior_to_mos():
    """Mean: MOS plus the GP posterior mean of MOS's residuals at the stations; variance: MOS's plus the GP's."""
    torch.manual_seed(2)
    decoder = MOSKrigingDecoder(PLACES, sources=["grid", "stations"], lengthscale=0.6, outputscale=0.5, noise=0.1)
    with torch.no_grad():
        decoder.coef.table.normal_()
        decoder.log_var.table.normal_()
    stations, xt = torch.rand(1, 4, 2) * 2, torch.rand(1, 3, 2) * 2
    states = context_set(torch.randn(1, len(GRID_SOURCE)), stations, torch.randn(1, 4))
    with torch.no_grad():
        out = decoder(states, torch.zeros(1, 3, 2), xt)
        x, z, mask, source = decoder.context(states)
        mos_t = decoder.regression(x, z, mask, source, xt)[0].double().numpy()
        residual = (z - decoder.regression(x, z, mask, source, x))[0, len(GRID_SOURCE) :].double().numpy()
        var_t = decoder.log_var(xt)[0, :, 0].exp().double().numpy()
    m, v = closed_form(stations[0].double().numpy(), residual, xt[0].double().numpy(), 0.6, 0.5, 0.1)
    np.testing.assert_allclose(out[0, :, 0].numpy(), mos_t + m, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out[0, :, 1].exp().numpy(), var_t + v, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("recipe", ["era5_mos.yaml", "era5_mos_kriging.yaml"])
def test_recipe_fits_and_tests_with_context_and_heldout_metrics(recipe, tmp_path, capsys):
    config = ["--config", str(ROOT / "recipes" / recipe), "--trainer.logger", "false"]
    days = [
        "--data.init_args.splits.val", '["2019-03-22", "2019-03-22"]',
        "--data.init_args.splits.test", '["2019-03-27", "2019-03-27"]', "--data.init_args.task.eval_stride", "12",
    ]  # fmt: skip
    quiet = ["--trainer.enable_progress_bar", "false"]
    small = ["--data.init_args.loader.train_batches", "3", "--data.init_args.loader.batch_size", "4"]
    steps = ["--trainer.max_steps", "3", "--trainer.val_check_interval", "3"]
    main(["fit", *config, *quiet, *small, *steps, *days, "--trainer.default_root_dir", str(tmp_path)])
    checkpoint = next(tmp_path.rglob("last.ckpt"))
    capsys.readouterr()
    main(["test", *config, *quiet, *days, "--ckpt_path", str(checkpoint)])
    table = capsys.readouterr().out.splitlines()
    assert any(line.split()[:4] == ["metric", "all", "context", "heldout"] for line in table), table
    row = next(line for line in table if line.startswith("test/rmse_physical "))
    values = [float(v) for v in row.split()[1:4]]  # all, context, heldout (calibrated)
    assert len(values) == 3 and all(math.isfinite(v) and v > 0 for v in values), row
