"""The {On, Off}-the-grid thesis's 1-D two-modality GP task, against closed forms computed with numpy."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from gridtnp.batch import Observations
from gridtnp.data.sections import from_flat_arguments
from gridtnp.data.synthetic.gp1d_multimodal import GP1DMultimodal, hadamard_covariance
from gridtnp.models import build_model
from gridtnp.registry import ConfigError, build_from_spec

ROOT = Path(__file__).resolve().parents[2]


def test_hadamard_covariance_is_the_task_covariance_times_the_se_kernel():
    x = torch.tensor([[-1.0, 0.0, 0.5, 2.0]], dtype=torch.float64)
    task = torch.tensor([1, 0, 1, 0])
    got = hadamard_covariance(x, task, torch.tensor([0.7]), 0.3)[0].numpy()
    tasks = np.array([[1.0, 0.3], [0.3, 1.0]])
    for i in range(4):  # a loop over pairs: C[t_i, t_j] k(x_i, x_j)
        for j in range(4):
            k = math.exp(-0.5 * (x[0, i].item() - x[0, j].item()) ** 2 / 0.7**2)
            assert got[i, j] == pytest.approx(tasks[task[i], task[j]] * k)


def test_batches_have_the_thesis_layout():
    task = build_from_spec("task", {"name": "gp1d_multimodal", "correlation": 0.5})
    batch = task.sample(4, torch.Generator().manual_seed(0))
    grid, points = batch.context["grid"], batch.context["points"]
    assert grid.x.shape == (4, 64, 1) and torch.allclose(grid.x[0, :2, 0], torch.tensor([-3.9375, -3.8125]))
    assert points.mask.sum(1).min() >= 1 and points.mask.sum(1).max() <= 64
    assert points.x[points.mask].abs().max() <= 2.0 and batch.target.x.shape == (4, 128, 1)
    assert batch.target.x.abs().max() <= 4.0 and batch.extras["oracle_loglik"].shape == (4,)
    off = GP1DMultimodal(modalities="off_grid").sample(2, torch.Generator().manual_seed(0))
    assert list(off.context) == ["points"]
    with pytest.raises(ConfigError, match="correlation"):
        GP1DMultimodal(correlation=1.5)


def test_thesis_code_draws_grid_ends_and_one_lengthscale_and_context_size_per_batch():
    spec = {"name": "gp1d_multimodal", "grid_layout": "ends", "draw_per_batch": True}
    batch = build_from_spec("task", spec).sample(8, torch.Generator().manual_seed(1))
    grid_x = batch.context["grid"].x[0, :, 0].numpy()
    np.testing.assert_allclose(grid_x, np.linspace(-4.0, 4.0, 64), atol=1e-6)  # 64 points, both ends included
    lengthscale, sizes = batch.extras["lengthscale"].numpy(), batch.context["points"].mask.sum(1).numpy()
    assert np.all(lengthscale == lengthscale[0]) and np.all(sizes == sizes[0])
    assert 0.25 <= lengthscale[0] <= 4.0 and 1 <= sizes[0] <= 64
    default = build_from_spec("task", {"name": "gp1d_multimodal"}).sample(8, torch.Generator().manual_seed(1))
    assert len(np.unique(default.extras["lengthscale"].numpy())) == 8  # per task unless asked
    with pytest.raises(ConfigError, match="grid_layout"):
        build_from_spec("task", {"name": "gp1d_multimodal", "grid_layout": "edges"})


@pytest.mark.parametrize("correlation", [0.0, 0.5, 0.8, 1.0])
def test_oracle_is_the_gaussian_conditional_computed_with_numpy(correlation: float):
    task = GP1DMultimodal(correlation=correlation, log_lengthscale_range=(0.0, 0.0), points_per_unit=2.0, noise=0.1)
    batch = task.sample(2, torch.Generator().manual_seed(1))
    for b in range(2):
        m = batch.context["points"].mask[b].numpy()
        xg, yg = batch.context["grid"].x[b, :, 0].double().numpy(), batch.context["grid"].y[b, :, 0].double().numpy()
        xp = batch.context["points"].x[b, m, 0].double().numpy()
        yp = batch.context["points"].y[b, m, 0].double().numpy()
        xt, yt = batch.target.x[b, :, 0].double().numpy(), batch.target.y[b, :, 0].double().numpy()
        x = np.concatenate([xg, xp, xt])
        t = np.array([1] * len(xg) + [0] * (len(xp) + len(xt)))
        c = np.where(t[:, None] == t[None, :], 1.0, correlation)
        cov = c * np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2)
        n = len(xg) + len(xp)
        k_cc = cov[:n, :n] + 0.01 * np.eye(n)
        solve = np.linalg.solve(k_cc, cov[:n, n:])  # [C, T]
        y_c = np.concatenate([yg, yp])
        mean = solve.T @ y_c
        var = np.diag(cov[n:, n:]) + 0.01 - np.einsum("ct,ct->t", cov[:n, n:], solve)
        want = np.mean(-0.5 * (np.log(2 * np.pi * var) + (yt - mean) ** 2 / var))
        # The batch's x are float32 and its oracle uses the float64 x it drew: agreement to float32 rounding.
        assert batch.extras["oracle_loglik"][b].item() == pytest.approx(want, abs=2e-3)


def test_samples_whiten_to_standard_normals_under_the_stated_covariance():
    """y whitened by the Cholesky factor of C (x) k + noise^2 I has mean 0 and variance 1 (many tasks)."""
    task = GP1DMultimodal(
        correlation=0.8,
        log_lengthscale_range=(0.0, 0.0),
        points_per_unit=1.0,
        min_context=4,
        max_context=4,
        num_targets=32,
    )
    batch = task.sample(200, torch.Generator().manual_seed(2))
    obs = [batch.context["grid"], batch.context["points"], batch.target]
    x = torch.cat([o.x[..., 0] for o in obs], 1).double()  # [B, N]: every task has the same sizes
    y = torch.cat([o.y[..., 0] for o in obs], 1).double()
    t = torch.cat([torch.full((o.x.shape[1],), int(i == 0)) for i, o in enumerate(obs)])
    cov = hadamard_covariance(x, t, torch.ones(200), 0.8) + 0.01 * torch.eye(x.shape[1])
    w = torch.linalg.solve_triangular(torch.linalg.cholesky(cov), y[..., None], upper=False)
    assert abs(w.mean().item()) < 0.03 and abs(w.var().item() - 1.0) < 0.05


@pytest.mark.parametrize("name", ["tnp", "setconv", "mhca"])
@pytest.mark.parametrize("modalities", ["both", "off_grid"])
def test_thesis_table_4_1_recipes_run_on_their_task(name: str, modalities: str):
    config = yaml.safe_load((ROOT / "recipes" / "thesis" / f"thesis_table4_1_{name}.yaml").read_text())
    spec = {k: v for k, v in config["model"]["init_args"].items() if k not in ("lr", "weight_decay")}
    task = build_from_spec("task", {**config["data"]["init_args"]["task"], "modalities": modalities})
    batch = task.sample(2, torch.Generator().manual_seed(0))
    with torch.no_grad():
        dist = build_model(spec)(batch.context, batch.target.x)
    assert dist.mean.shape == (2, 128, 1) and torch.isfinite(dist.mean).all()


def test_swin_with_patch_coarsening_is_the_patch_convolution_then_swin_on_the_coarse_grid():
    from gridtnp.nn.grids import Grid
    from gridtnp.nn.processors.convolutional import channels_first, channels_last
    from gridtnp.nn.processors.grid_transformers import SwinProcessor
    from gridtnp.nn.tokens import Latent

    torch.manual_seed(0)
    grid = Grid([-4.0, -4.0], [4.0, 4.0], [8, 8])
    pc = SwinProcessor(grid, dim=16, layers=2, window=2, heads=2, head_dim=8, mlp_dim=16, patch=2)
    assert pc.grid.shape == (4, 4) and pc.grid.lower == pytest.approx((-4 + 4 / 7,) * 2)  # 2 x 2 patch centres
    plain = SwinProcessor(pc.grid, dim=16, layers=2, window=2, heads=2, head_dim=8, mlp_dim=16)
    plain.blocks.load_state_dict(pc.blocks.state_dict())
    tokens = torch.randn(2, 8, 8, 16)
    # The patch embedding by hand: each coarse token is W . (its 2 x 2 block of fine tokens) + b.
    w, b = pc.embed.weight.detach(), pc.embed.bias.detach()
    blocks = tokens.reshape(2, 4, 2, 4, 2, 16).permute(0, 1, 3, 5, 2, 4)  # [B, 4, 4, C, 2, 2]
    coarse = torch.einsum("oihw,bxyihw->bxyo", w, blocks) + b
    torch.testing.assert_close(channels_last(pc.embed(channels_first(tokens))), coarse, rtol=1e-5, atol=1e-5)
    got = pc(Latent(tokens, grid=grid))
    want = plain(Latent(coarse, grid=pc.grid))
    assert len(got) == 2 and got[-1].grid == pc.grid
    torch.testing.assert_close(got[-1].tokens, want[-1].tokens, rtol=1e-4, atol=1e-5)


def test_thesis_patch_coarsening_swin_recipe_runs_on_its_task():
    config = yaml.safe_load((ROOT / "recipes" / "thesis" / "thesis_fig4_5_pc_swin.yaml").read_text())
    spec = {k: v for k, v in config["model"]["init_args"].items() if k not in ("lr", "weight_decay")}
    batch = build_from_spec("task", config["data"]["init_args"]["task"]).sample(2, torch.Generator().manual_seed(0))
    assert batch.context["grid"].x.shape == (2, 64, 2)
    with torch.no_grad():
        dist = build_model(spec)(batch.context, batch.target.x)
    assert dist.mean.shape == (2, 128, 1) and torch.isfinite(dist.mean).all()


@pytest.mark.parametrize("k", [None, 3])
def test_gka_lengthscale_field_is_the_kernel_average_with_sigma_of_the_target(k: int | None):
    """lengthscale_mlp: w_n = exp(-0.5 sum_d ((x_t,d - x_n,d) / sigma_d(x_t))^2), checked with a numpy loop."""
    from gridtnp.nn.grid_decoders.kernel_averaging import GKADecoder
    from gridtnp.nn.tokens import Latent

    torch.manual_seed(0)
    gka = GKADecoder(dim=2, dim_x=2, lengthscale=[0.5, 2.0], k=k, lengthscale_mlp=True, hidden=8)
    torch.nn.init.normal_(gka.scale_field[-1].weight)  # a non-trivial field (it starts at exp(0) = 1)
    x, z, xt = torch.randn(1, 6, 2), torch.randn(1, 6, 2), torch.randn(1, 4, 2)
    mask = torch.ones(1, 6, dtype=torch.bool)
    got = gka([Latent(z, mask=mask, x=x)], torch.zeros(1, 4, 2), xt)[0].detach().numpy()
    sigma = (gka.lengthscale * gka.scale_field(xt).exp())[0].detach().numpy()  # [Nt, 2]
    xn, zn, xq = x[0].numpy(), z[0].numpy(), xt[0].numpy()
    base = gka.lengthscale.detach().numpy()
    for t in range(4):  # a loop over targets and context points
        logits = np.array([-0.5 * np.sum(((xq[t] - xn[n]) / sigma[t]) ** 2) for n in range(6)])
        keep = np.ones(6, bool)
        if k is not None:  # the k nearest in the base metric
            keep[:] = False
            keep[np.argsort([np.sum(((xq[t] - xn[n]) / base) ** 2) for n in range(6)])[:k]] = True
        w = np.where(keep, np.exp(logits - logits[keep].max()), 0.0)
        np.testing.assert_allclose(got[t], (w[:, None] * zn).sum(0) / w.sum(), rtol=1e-4, atol=1e-5)


def test_gka_lengthscale_mlp_recipe_builds():
    config = yaml.safe_load((ROOT / "recipes" / "thesis" / "attention_gka_lengthscale_mlp.yaml").read_text())
    spec = {k: v for k, v in config["model"]["init_args"].items() if k not in ("lr", "warmup_steps", "lr_schedule")}
    model = build_model(spec)
    assert model.grid_decoder.scale_field is not None
    context = {"stations": Observations(torch.randn(1, 5, 2), torch.randn(1, 5, 1), torch.ones(1, 5, dtype=torch.bool))}
    with torch.no_grad():
        assert torch.isfinite(model(context, torch.randn(1, 3, 2)).mean).all()


def test_patch_grid_encoder_is_the_fine_average_then_the_patch_map_by_hand():
    from gridtnp.nn.grid_encoders import PatchGridEncoder
    from gridtnp.nn.grids import Grid
    from gridtnp.nn.tokens import Tokens

    torch.manual_seed(0)
    grid = Grid([0.0, 0.0], [3.0, 3.0], [4, 4])  # fine points 0, 1, 2, 3 along each axis
    enc = PatchGridEncoder(grid, dim=3, in_dim=2, patch=2)
    x = torch.tensor([[[0.1, 0.2], [0.2, -0.1], [2.9, 1.1], [1.0, 3.0]]])  # cells (0,0), (0,0), (3,1), (1,3)
    z = torch.randn(1, 4, 2)
    out = enc({"s": Tokens(x, z, torch.ones(1, 4, dtype=torch.bool))})
    assert out.grid.shape == (2, 2) and out.grid.lower == (0.5, 0.5)
    proj = enc.fine.proj
    fine = enc.fine.empty.detach().expand(4, 4, 3).clone()  # empty cells: the learned empty token
    for cell, members in {(0, 0): [0, 1], (3, 1): [2], (1, 3): [3]}.items():  # a loop over occupied cells
        fine[cell] = proj(z[0, members].mean(0)).detach()
    w, b = enc.embed.weight.detach(), enc.embed.bias.detach()  # [out, in, 2, 2]
    for i in range(2):
        for j in range(2):
            patch = fine[2 * i : 2 * i + 2, 2 * j : 2 * j + 2]  # [2, 2, C]
            want = torch.einsum("oiab,abi->o", w, patch) + b
            torch.testing.assert_close(out.tokens[0, i, j], want, rtol=1e-5, atol=1e-5)


def test_thesis_patch_before_grid_encoder_recipe_runs_on_its_task():
    config = yaml.safe_load((ROOT / "recipes" / "thesis" / "thesis_pc_before_grid_encoder.yaml").read_text())
    spec = {k: v for k, v in config["model"]["init_args"].items() if k not in ("lr", "weight_decay")}
    batch = build_from_spec("task", config["data"]["init_args"]["task"]).sample(2, torch.Generator().manual_seed(0))
    model = build_model(spec)
    assert model.grid_encoder.grid.shape == (4, 4)
    with torch.no_grad():
        dist = model(batch.context, batch.target.x)
    assert dist.mean.shape == (2, 128, 1) and torch.isfinite(dist.mean).all()


def test_era5_task_with_random_off_grid_points_and_a_fixed_number_of_targets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """random_points: values at random grid points (checked against the store via xarray), new points per task,
    context and targets disjoint, exactly num_targets targets."""
    from gridtnp.data import StationReanalysisDataModule
    from gridtnp.data.store import normalisation_stats, open_store

    monkeypatch.setenv("GRIDTNP_CACHE", str(tmp_path))
    dm = from_flat_arguments(
        StationReanalysisDataModule,
        store=None,
        random_points=60,
        num_targets=25,
        context_fraction=(0.2, 0.5),
        batch_size=3,
    )
    dm.prepare_data()
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    context, target = batch.context["stations"], batch.target
    assert target.x.shape == (3, 25, 2) and target.mask.all()
    assert context.mask.sum(1).min() >= 12 and context.mask.sum(1).max() <= 30  # floor(share x 60)
    ds = open_store(dm.store_path())
    mean, std = normalisation_stats(ds, "t2m")
    for b in range(3):
        hour = int(batch.extras["hour"][b])
        xs = torch.cat([context.x[b, context.mask[b]], target.x[b]]).double().numpy()
        ys = torch.cat([context.y[b, context.mask[b], 0], target.y[b, :, 0]]).double().numpy() * std + mean
        assert len({tuple(p) for p in xs.round(4).tolist()}) == len(xs)  # distinct points, context and targets apart
        for (lat, lon), y in zip(xs, ys, strict=True):  # a loop over points: the store's value there
            want = float(ds["t2m"].isel(time=hour).sel(latitude=lat, longitude=lon, method="nearest"))
            assert y == pytest.approx(want, abs=1e-3)
    assert not torch.equal(target.x[0], target.x[1])  # drawn anew per task
    with pytest.raises(ConfigError, match="num_targets"):
        from_flat_arguments(StationReanalysisDataModule, store=None, random_points=10, num_targets=10).setup()


def test_thesis_era5_recipe_builds_and_its_data_section_constructs():
    config = yaml.safe_load((ROOT / "recipes" / "thesis" / "thesis_era5_random_points.yaml").read_text())
    spec = {k: v for k, v in config["model"]["init_args"].items() if k not in ("lr", "weight_decay")}
    model = build_model(spec)
    assert model.grid_encoder.grid.shape == (30, 60)
    from gridtnp.data import StationReanalysisDataModule

    dm = StationReanalysisDataModule(**config["data"]["init_args"])  # checks every option (no store is opened)
    assert (dm.random_points, dm.num_targets) == (5000, 3000)  # 1-2k context points, 3,000 targets (Fig. 4.9)
    assert dm.batch_size * dm.train_batches == 8000  # the thesis's 8,000 training tasks per epoch
