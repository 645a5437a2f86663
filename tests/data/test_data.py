"""Tests for the synthetic task generators and the synthetic DataModule."""

from __future__ import annotations

import math
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from gridtnp.batch import DEFAULT_SOURCE, Batch
from gridtnp.data import SyntheticDataModule
from gridtnp.data.datamodules import FixedTaskSet, TrainTaskStream
from gridtnp.data.sections import from_flat_arguments
from gridtnp.data.synthetic.gp import GP1D, GP2D, GP2DMultimodal
from gridtnp.data.synthetic.gp_kernels import SKI_MARGIN, SKIGrid, mixed_kernel_matrix, predictive_loglik
from gridtnp.data.synthetic.sawtooth import Sawtooth2DRestricted, sawtooth
from gridtnp.registry import ConfigError, build_from_spec

# Small configurations of every registered task, so the whole file stays fast.
SMALL = {
    "gp1d": {"name": "gp1d", "max_context": 20, "num_targets": 30},
    "gp2d": {"name": "gp2d", "num_context": 300, "num_targets": 50, "min_context": 10, "grid_size": 40},
    "gp2d_multimodal": {"name": "gp2d_multimodal", "min_context": 5, "max_context": 40, "num_targets": 30},
    "sawtooth1d": {"name": "sawtooth1d", "max_context": 20},
    "sawtooth2d": {"name": "sawtooth2d", "max_context": 50, "num_targets": 40},
    "sawtooth2d_restricted": {"name": "sawtooth2d_restricted", "max_context": 50, "num_targets": 40},
}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_batches_equal(a: Batch, b: Batch) -> None:
    assert a.context.keys() == b.context.keys()
    for key in a.context:
        for name in ("x", "y", "mask"):
            assert torch.equal(getattr(a.context[key], name), getattr(b.context[key], name)), (key, name)
    for name in ("x", "y", "mask"):
        assert torch.equal(getattr(a.target, name), getattr(b.target, name)), name
    assert a.extras.keys() == b.extras.keys()
    for key in a.extras:
        assert torch.equal(a.extras[key], b.extras[key]), key


@pytest.mark.parametrize("name", sorted(SMALL))
def test_task_shapes_dtypes_and_masks(name: str) -> None:
    task = build_from_spec("task", SMALL[name])
    batch = task.sample(5, gen(0))
    assert isinstance(batch, Batch) and batch.batch_size == 5
    assert set(batch.context) == set(task.dim_y)
    for source, obs in batch.context.items():
        assert obs.x.shape[-1] == task.dim_x and obs.y.shape[-1] == task.dim_y[source]
        assert obs.x.dtype == obs.y.dtype == torch.float32 and obs.mask.dtype == torch.bool
        assert torch.isfinite(obs.x).all() and torch.isfinite(obs.y).all()
        # Padded entries are zeros; the widest task fills the padded width.
        assert (obs.x[~obs.mask] == 0).all() and (obs.y[~obs.mask] == 0).all()
        assert obs.mask.sum(1).max() == obs.num_points
    tgt = batch.target
    assert tgt.x.shape[-1] == task.dim_x and tgt.y.shape[-1] == task.target_dim_y
    assert tgt.y.dtype == torch.float32 and tgt.mask.all()
    for value in batch.extras.values():
        assert value.shape == (5,) and value.dtype == torch.float32 and torch.isfinite(value).all()


@pytest.mark.parametrize("name", sorted(SMALL))
def test_task_determinism(name: str) -> None:
    task = build_from_spec("task", SMALL[name])
    assert_batches_equal(task.sample(4, gen(7)), task.sample(4, gen(7)))
    a, b = task.sample(4, gen(7)), task.sample(4, gen(8))
    assert not torch.equal(a.target.y, b.target.y)


def test_context_sizes_within_range_and_domains() -> None:
    task = GP1D(min_context=3, max_context=9, num_targets=16)
    batch = task.sample(200, gen(1))
    n = batch.context[DEFAULT_SOURCE].mask.sum(1)
    assert n.min() == 3 and n.max() == 9  # with 200 tasks both ends occur
    mask = batch.context[DEFAULT_SOURCE].mask
    assert torch.equal(mask, torch.arange(mask.shape[1]) < n[:, None])  # real points come first
    x_c = batch.context[DEFAULT_SOURCE].x[mask]
    assert x_c.min() >= -2 and x_c.max() <= 2 and batch.target.x.abs().max() <= 3
    assert batch.target.x.abs().max() > 2  # targets extend beyond the context range

    empty = GP1D(min_context=0, max_context=0, num_targets=8).sample(3, gen(0))
    assert empty.context[DEFAULT_SOURCE].x.shape == (3, 0, 1)

    varying = GP2D(num_context=60, min_context=0, num_targets=5, grid_size=20).sample(50, gen(2))
    n2 = varying.context[DEFAULT_SOURCE].mask.sum(1)
    assert n2.min() >= 0 and n2.max() <= 60 and len(n2.unique()) > 10


def test_invalid_arguments_raise_actionable_errors() -> None:
    with pytest.raises(ConfigError, match=r"min_context.*max_context"):
        GP1D(min_context=10, max_context=5)
    with pytest.raises(ConfigError, match="matern52"):
        GP1D(kernels=("se", "rq"))
    with pytest.raises(ConfigError, match="oracle"):
        GP2D(oracle=True)  # 11,000 points is too many for an exact oracle
    with pytest.raises(ConfigError, match="correlation"):
        GP2DMultimodal(correlation=1.5)
    with pytest.raises(ConfigError, match="context_range"):
        build_from_spec("task", {"name": "sawtooth1d", "context_range": (2.0, -2.0)})


def _reference_loglik(k: torch.Tensor, y: torch.Tensor, ctx: torch.Tensor, tgt: torch.Tensor, noise_var: float):
    """Posterior predictive marginals for one task by explicit inversion over the real context points."""
    k_cc = k[ctx][:, ctx] + noise_var * torch.eye(int(ctx.sum()), dtype=k.dtype)
    k_tc = k[tgt][:, ctx]
    mean = k_tc @ torch.linalg.inv(k_cc) @ y[ctx]
    var = k[tgt][:, tgt].diagonal() - (k_tc @ torch.linalg.inv(k_cc) * k_tc).sum(-1) + noise_var
    return torch.distributions.Normal(mean, var.sqrt()).log_prob(y[tgt]).mean()


def test_predictive_loglik_matches_dense_reference_with_padding() -> None:
    g = gen(3)
    x = torch.rand(2, 9, 1, generator=g, dtype=torch.float64) * 4 - 2
    k = torch.exp(-0.5 * (x - x.transpose(1, 2)).square() / 0.7**2) + 1e-6 * torch.eye(9, dtype=torch.float64)
    y = torch.linalg.cholesky(k + 0.04 * torch.eye(9)) @ torch.randn(2, 9, 1, generator=g, dtype=torch.float64)
    y = y[..., 0]
    mask_c = torch.tensor([[True, True, True, True, True], [True, True, False, False, False]])
    got = predictive_loglik(
        k[:, :5, :5],
        k[:, 5:, :5],
        k[:, 5:, 5:].diagonal(dim1=1, dim2=2),
        y[:, :5],
        mask_c,
        y[:, 5:],
        torch.ones(2, 4, dtype=torch.bool),
        0.04,
    )
    for b in range(2):
        ctx = torch.cat([mask_c[b], torch.zeros(4, dtype=torch.bool)])
        tgt = torch.cat([torch.zeros(5, dtype=torch.bool), torch.ones(4, dtype=torch.bool)])
        assert torch.allclose(got[b], _reference_loglik(k[b], y[b], ctx, tgt, 0.04), atol=1e-8)


def test_gp1d_oracle_beats_prior_and_empty_context_is_prior() -> None:
    task = GP1D(num_targets=64)
    batch = task.sample(64, gen(4))
    oracle = batch.extras["oracle_loglik"]
    prior_std = math.sqrt(1.0 + task.jitter + task.noise**2)
    prior = torch.distributions.Normal(0.0, prior_std).log_prob(batch.target.y[..., 0]).mean(1)
    assert torch.isfinite(oracle).all()
    assert oracle.mean() > prior.mean() + 0.2
    # The oracle can never be much worse than the prior on average, and is bounded by the noise level.
    assert oracle.max() < torch.distributions.Normal(0.0, 0.2).log_prob(torch.tensor(0.0)) + 1.0

    empty = GP1D(min_context=0, max_context=0, num_targets=32).sample(8, gen(5))
    prior_empty = torch.distributions.Normal(0.0, prior_std).log_prob(empty.target.y[..., 0]).mean(1)
    assert torch.allclose(empty.extras["oracle_loglik"], prior_empty, atol=1e-5)


def test_kernel_families_match_closed_forms() -> None:
    r = torch.tensor([0.0, 0.25, 0.7, 1.0], dtype=torch.float64)
    x = torch.stack([torch.zeros(4, dtype=torch.float64), r], -1)[None, :, :, None].reshape(4, 2, 1)
    ls, period = torch.full((4,), 0.5), torch.ones(4)
    z = math.sqrt(5) * r / 0.5
    expected = {
        "se": torch.exp(-0.5 * r.square() / 0.25),
        "matern52": (1 + z + z.square() / 3) * torch.exp(-z),
        "periodic": torch.exp(-2 * torch.sin(math.pi * r / 1.0).square() / 0.25),
    }
    for i, name in enumerate(("se", "matern52", "periodic")):
        family = torch.full((4,), i)
        k = mixed_kernel_matrix(x, family, ls, period, ("se", "matern52", "periodic"))
        assert torch.allclose(k[:, 0, 1], expected[name], atol=1e-6), name
    # A periodic-only gp1d task with a fixed period runs and draws every family index it is given.
    task = GP1D(kernels=("periodic",), period_range=(1.0, 1.0), max_context=4, num_targets=8)
    assert task.kernels == ("periodic",) and torch.isfinite(task.sample(4, gen(6)).target.y).all()


def test_gp1d_periodic_kernel_is_the_papers_k_pe_with_the_lengthscale_as_period() -> None:
    """Default periodic tasks use ``exp(-2 sin^2(pi |x - x'| / l))``: the oracle log-likelihood equals one computed
    from that closed form; ``periodic="standard"`` uses ``exp(-2 sin^2(pi r / p) / l^2)`` with its drawn period."""
    for form in ("paper", "standard"):
        task = GP1D(kernels=("periodic",), min_context=5, max_context=5, num_targets=6, periodic=form)
        batch = task.sample(3, gen(7))
        x = torch.cat([batch.context[DEFAULT_SOURCE].x, batch.target.x], 1)[..., 0].double()
        y = torch.cat([batch.context[DEFAULT_SOURCE].y, batch.target.y], 1)[..., 0].double()
        ls, period = batch.extras["lengthscale"].double(), batch.extras["period"].double()
        for b in range(3):
            r = (x[b, :, None] - x[b, None, :]).abs()
            if form == "paper":
                assert period[b] == ls[b]
                k = torch.exp(-2 * torch.sin(math.pi * r / ls[b]).square())
            else:
                k = torch.exp(-2 * torch.sin(math.pi * r / period[b]).square() / ls[b] ** 2)
            k = k + task.jitter * torch.eye(11, dtype=torch.float64)
            ctx = torch.arange(11) < 5
            want = _reference_loglik(k, y[b], ctx, ~ctx, task.noise**2)
            torch.testing.assert_close(batch.extras["oracle_loglik"][b].double(), want, atol=2e-4, rtol=1e-4)
    with pytest.raises(ConfigError, match="periodic must be one of"):
        GP1D(periodic="other")


def ski_empirical_covariance_error(lengthscale: float, grid_size: int | None, samples: int = 3000) -> float:
    """Largest |empirical - SE| covariance of SKI fields (GP2D's sampler) at 16 points within 2 length-scales."""
    domain = (-10 * lengthscale, 10 * lengthscale)
    grid = GP2D(lengthscale=lengthscale, domain=domain, grid_size=grid_size, num_context=1, num_targets=1).grid
    g = gen(11)
    x = (torch.rand(1, 16, 2, generator=g) * 4 - 2) * lengthscale
    f = torch.cat([grid.interpolate(grid.sample(500, g), x.expand(500, -1, -1)) for _ in range(samples // 500)])
    empirical = f.T.double() @ f.double() / f.shape[0]  # mean-zero fields
    se = torch.exp(-0.5 * (x[0, :, None] - x[0, None]).square().sum(-1).double() / lengthscale**2)
    return float((empirical - se).abs().max())


@pytest.mark.parametrize("lengthscale", [0.1, 0.5])
def test_ski_fields_have_the_se_covariance(lengthscale: float) -> None:
    """The default SKI grid (4 nodes per length-scale) draws SE fields: the empirical covariance of 3,000 fields is
    within Monte-Carlo error (about 0.026 per entry) of the SE kernel; the paper's node spacing over [-6, 6]^2
    (100 nodes, 0.126) is not at l = 0.1. Over GP2D's default domain the exact SKI covariance is within 0.005."""
    assert ski_empirical_covariance_error(lengthscale, None) < 0.1
    task = GP2D(lengthscale=lengthscale, num_context=1, num_targets=1)
    x = torch.rand(1, 200, 2, generator=gen(12), dtype=torch.float64) * 2 - 1
    exact = task.grid.covariance(x, x)[0]
    se = torch.exp(-0.5 * (x[0, :, None] - x[0, None]).square().sum(-1) / lengthscale**2)
    assert (exact - se).abs().max() < 0.005
    if lengthscale == 0.1:
        paper_spacing = GP2D(lengthscale=0.1, grid_size=100, num_context=1, num_targets=1).grid.step
        old_size = round(20 * lengthscale / paper_spacing) + 1 + 2 * SKI_MARGIN
        assert ski_empirical_covariance_error(lengthscale, old_size) > 0.15


def test_ski_interpolation_is_exact_at_nodes_and_covariance_matches_se() -> None:
    grid = SKIGrid((-2.0, 2.0), 40, lengthscale=0.5)
    field = grid.sample(3, gen(0))
    i = torch.tensor([5, 17, 30])
    j = torch.tensor([8, 8, 33])
    nodes = torch.stack([grid.nodes[i], grid.nodes[j]], -1).float()[None].expand(3, 3, 2)
    assert torch.allclose(grid.interpolate(field, nodes), field[:, i, j], atol=1e-4)

    x = torch.rand(1, 200, 2, generator=gen(1)) * 4 - 2
    d2 = (x[:, :, None] - x[:, None]).square().sum(-1).double()
    assert (grid.covariance(x, x) - torch.exp(-0.5 * d2 / 0.25)).abs().max() < 0.01


def test_gp2d_empirical_covariance_matches_se_kernel() -> None:
    lengthscale, noise = 0.5, 0.1
    task = GP2D(lengthscale=lengthscale, noise=noise, num_context=250, num_targets=50, domain=(-3.0, 3.0), grid_size=64)
    batch = task.sample(128, gen(11))  # enough tasks that the estimates below are within about 0.05
    x = torch.cat([batch.context[DEFAULT_SOURCE].x, batch.target.x], 1)
    y = torch.cat([batch.context[DEFAULT_SOURCE].y, batch.target.y], 1)[..., 0]
    d = (x[:, :, None] - x[:, None]).norm(dim=-1)
    prod = y[:, :, None] * y[:, None]
    off = ~torch.eye(x.shape[1], dtype=torch.bool)
    assert (y.square().mean() - (1 + noise**2)).abs() < 0.15
    for low, high in ((0.0, 0.1), (0.45, 0.55), (1.0, 1.1)):
        sel = off & (d >= low) & (d < high)
        expected = torch.exp(-0.5 * d[sel].square() / lengthscale**2).mean()
        assert (prod[sel].mean() - expected).abs() < 0.1, (low, high, prod[sel].mean(), expected)


def test_gp2d_small_oracle_beats_prior() -> None:
    task = GP2D(num_context=200, num_targets=50, grid_size=40, domain=(-2.0, 2.0), oracle=True)
    batch = task.sample(8, gen(12))
    prior = torch.distributions.Normal(0.0, math.sqrt(1.01)).log_prob(batch.target.y[..., 0]).mean(1)
    assert torch.isfinite(batch.extras["oracle_loglik"]).all()
    assert batch.extras["oracle_loglik"].mean() > prior.mean() + 0.5


@pytest.mark.parametrize("correlation", [0.8, -0.3])
def test_multimodal_correlation_between_modalities(correlation: float) -> None:
    lengthscale = 0.5
    task = GP2DMultimodal(
        correlation=correlation, noise=0.0, min_context=1, max_context=10, num_targets=200, lengthscale=lengthscale
    )
    batch = task.sample(96, gen(13))
    grid = batch.context["grid"]
    n = round(math.sqrt(grid.num_points))
    assert grid.num_points == 24 * 24 == n * n and grid.mask.all()
    cells = grid.x.view(96, n, n, 2)
    assert torch.allclose(cells[0, 3, 5], torch.tensor([-3 + 3.5 / 4, -3 + 5.5 / 4]))  # 'ij' order, cell centres
    # E[f1(a) f2(b)] = c k(a - b): estimate c from every (grid, target) pair.
    d2 = (grid.x[:, :, None] - batch.target.x[:, None]).square().sum(-1)
    k = torch.exp(-0.5 * d2 / lengthscale**2)
    prod = grid.y[:, :, None, 0] * batch.target.y[:, None, :, 0]
    estimate = (prod * k).sum() / k.square().sum()
    assert abs(estimate - correlation) < 0.1, estimate
    # Both modalities have unit variance.
    assert (grid.y.square().mean() - 1).abs() < 0.2 and (batch.target.y.square().mean() - 1).abs() < 0.2


def test_multimodal_oracle_uses_both_sources() -> None:
    strong = GP2DMultimodal(correlation=0.95, min_context=0, max_context=0, num_targets=40, oracle=True)
    none = GP2DMultimodal(correlation=0.0, min_context=0, max_context=0, num_targets=40, oracle=True)
    # With no point context, only a correlated grid modality can inform the targets.
    ll_strong = strong.sample(4, gen(14)).extras["oracle_loglik"].mean()
    ll_none = none.sample(4, gen(14)).extras["oracle_loglik"].mean()
    assert ll_strong > ll_none + 0.5


def test_sawtooth_series_matches_loop_reference() -> None:
    u = torch.linspace(-2, 2, 11)[None].expand(2, 11)
    freq, shift, terms = torch.tensor([3.0, 4.5]), torch.tensor([0.3, -1.0]), torch.tensor([10, 20])
    got = sawtooth(u, freq, shift, terms, max_terms=20, amplitude=1.0)
    for b in range(2):
        arg = freq[b].double() * (u[b].double() + shift[b].double())
        ref = 0.5 - sum((-1) ** k * torch.sin(2 * math.pi * k * arg) / k for k in range(1, int(terms[b]) + 1)) / math.pi
        assert torch.allclose(got[b].double(), ref, atol=1e-4), (got[b].double() - ref).abs().max()
    # A truncated series of a unit sawtooth stays near [0, 1] (Gibbs overshoot of about 9 %).
    y = build_from_spec("task", "sawtooth1d").sample(32, gen(0)).target.y
    assert y.min() > -0.15 and y.max() < 1.15 and y.std() > 0.2


def test_sawtooth_restricted_directions() -> None:
    train = Sawtooth2DRestricted().directions(400, gen(0))
    diag = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [1.0, -1.0], [-1.0, 1.0]]) / math.sqrt(2)
    assert torch.allclose(train.norm(dim=-1), torch.ones(400))
    assert ((train[:, None] - diag).norm(dim=-1).min(1).values < 1e-5).all()
    assert len(torch.unique(train.round(decimals=4), dim=0)) == 4
    rotated = Sawtooth2DRestricted(test_rotated=True).directions(400, gen(0))
    assert torch.allclose(rotated.norm(dim=-1), torch.ones(400))
    assert ((rotated[:, None] - diag).norm(dim=-1).min(1).values > 1e-3).float().mean() > 0.99


# ------------------------------------------------------------------------------------------------ datamodule


def test_datamodule_train_loader_yields_batches_and_dims() -> None:
    spec = {"name": "gp2d_multimodal", "min_context": 5, "max_context": 30}
    dm = from_flat_arguments(SyntheticDataModule, spec, batch_size=3, train_batches=4)
    assert dm.dim_x == 2 and dm.dim_y == {"grid": 1, "points": 1} and dm.task.target_dim_y == 1
    batches = list(dm.train_dataloader())
    assert len(batches) == 4 == len(dm.train_dataloader())
    assert all(isinstance(b, Batch) and b.batch_size == 3 for b in batches)
    assert not torch.equal(batches[0].target.y, batches[1].target.y)


def test_datamodule_val_and_test_sets_are_fixed() -> None:
    spec = {"name": "gp1d", "max_context": 10, "num_targets": 10}
    a = from_flat_arguments(SyntheticDataModule, spec, batch_size=2, val_batches=3, test_batches=2, seed=5)
    b = from_flat_arguments(SyntheticDataModule, dict(spec), batch_size=2, val_batches=3, seed=5)
    val_a, val_b = list(a.val_dataloader()), list(b.val_dataloader())
    assert len(val_a) == 3
    for x, y in zip(val_a, val_b, strict=True):
        assert_batches_equal(x, y)
    assert_batches_equal(val_a[1], list(a.val_dataloader())[1])  # and across passes
    test_a = list(a.test_dataloader())
    assert not torch.equal(test_a[0].target.y, val_a[0].target.y)  # splits differ
    c = from_flat_arguments(SyntheticDataModule, spec, batch_size=2, val_batches=3, seed=6)
    assert not torch.equal(next(iter(c.val_dataloader())).target.y, val_a[0].target.y)
    assert isinstance(a.val_dataloader().dataset, FixedTaskSet)


def test_train_stream_differs_by_rank_and_epoch_and_is_reproducible() -> None:
    task = GP1D(max_context=10, num_targets=10)
    rank0, rank1 = (TrainTaskStream(task, 2, 3, seed=0, rank=r, world_size=2) for r in (0, 1))
    first0, first1 = next(iter(rank0)), next(iter(rank1))
    assert not torch.equal(first0.target.y, first1.target.y)
    assert_batches_equal(first0, next(iter(TrainTaskStream(task, 2, 3, seed=0, rank=0, world_size=2))))
    rank0.set_epoch(1)
    assert not torch.equal(next(iter(rank0)).target.y, first0.target.y)


def test_train_loader_follows_trainer_epoch() -> None:
    dm = from_flat_arguments(SyntheticDataModule, "sawtooth1d", batch_size=2, train_batches=2)
    dm.trainer = SimpleNamespace(current_epoch=0, global_rank=0)
    loader = dm.train_dataloader()
    epoch0 = list(loader)
    dm.trainer.current_epoch = 1
    epoch1 = list(loader)
    dm.trainer.current_epoch = 0
    again = list(loader)
    assert not torch.equal(epoch0[0].target.y, epoch1[0].target.y)
    for x, y in zip(epoch0, again, strict=True):
        assert_batches_equal(x, y)
    dm.trainer = SimpleNamespace(current_epoch=0, global_rank=1, world_size=2)
    assert not torch.equal(next(iter(dm.train_dataloader())).target.y, epoch0[0].target.y)
    # Without a trainer, each pass over the loader is a new epoch.
    dm.trainer = None
    plain = dm.train_dataloader()
    assert not torch.equal(next(iter(plain)).target.y, next(iter(plain)).target.y)


def test_train_batches_do_not_depend_on_worker_count() -> None:
    spec = {"name": "gp1d", "max_context": 8, "num_targets": 8}
    serial = list(
        from_flat_arguments(SyntheticDataModule, spec, batch_size=2, train_batches=4, num_workers=0).train_dataloader()
    )
    parallel = list(
        from_flat_arguments(SyntheticDataModule, spec, batch_size=2, train_batches=4, num_workers=2).train_dataloader()
    )
    assert len(parallel) == 4
    key = lambda b: b.target.y.sum().item()  # noqa: E731
    assert sorted(map(key, serial)) == pytest.approx(sorted(map(key, parallel)))


def test_datamodule_errors() -> None:
    with pytest.raises(ConfigError, match=r"gp1d.*sawtooth1d"):
        from_flat_arguments(SyntheticDataModule, {"name": "gp3d"})
    with pytest.raises(ConfigError, match="max_contxt"):
        from_flat_arguments(SyntheticDataModule, {"name": "gp1d", "max_contxt": 3})
    with pytest.raises(ConfigError, match="batch_size"):
        from_flat_arguments(SyntheticDataModule, "gp1d", batch_size=0)


class _Recorder(L.LightningModule):
    """Records the first target values of every batch it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.train_seen: list[tuple[int, float]] = []
        self.val_seen: list[tuple[int, float]] = []

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        self.train_seen.append((self.current_epoch, batch.target.y.sum().item()))
        return (self.weight - batch.target.y.mean()).square()

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self.val_seen.append((self.current_epoch, batch.target.y.sum().item()))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_datamodule_under_lightning_trainer() -> None:
    dm = from_flat_arguments(
        SyntheticDataModule,
        {"name": "gp1d", "max_context": 8, "num_targets": 8},
        batch_size=2,
        train_batches=3,
        val_batches=2,
    )
    module = _Recorder()
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, datamodule=dm)
    train = {e: [v for ep, v in module.train_seen if ep == e] for e in (0, 1)}
    val = {e: [v for ep, v in module.val_seen if ep == e] for e in (0, 1)}
    assert len(train[0]) == len(train[1]) == 3
    assert train[0] != train[1]  # fresh tasks every epoch
    assert val[0] == val[1] and len(val[0]) == 2  # fixed validation set
