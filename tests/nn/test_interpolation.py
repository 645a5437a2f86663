"""The cell-list k-NN search and the learned linear-interpolation baseline.

References: brute-force distances to every point (``torch.cdist`` and sorting) for the k-NN search, and
interpolation written out by hand, point by point in Python loops, for bilinear and inverse-distance weighting.
"""

from __future__ import annotations

import math

import pytest
import torch

from gridtnp.batch import Observations
from gridtnp.models import build_model, count_parameters, create_model
from gridtnp.nn.grid_decoders.interpolation import InterpolationDecoder, inverse_distance, multilinear
from gridtnp.nn.neighbours import knn_points
from gridtnp.nn.tokens import Latent
from gridtnp.registry import ConfigError


def brute_force_knn(xc: torch.Tensor, mask: torch.Tensor, xt: torch.Tensor, k: int) -> torch.Tensor:
    """Sorted distances ``[B, Nt, min(k, Nc)]`` to the nearest valid points, inf where a task has fewer."""
    dist = torch.cdist(xt.double(), xc.double()).masked_fill(~mask[:, None], float("inf"))
    return dist.topk(min(k, xc.shape[1]), largest=False).values


@pytest.mark.parametrize(
    ("b", "nc", "nt", "k", "d", "spread"),
    [
        (2, 2000, 300, 4, 2, 1.0),  # uniform in a square
        (2, 2000, 300, 16, 2, 1.2),  # targets up to 20 % outside the context's box
        (3, 300, 100, 7, 1, 1.0),
        (2, 1500, 200, 9, 3, 1.0),
        (2, 40, 30, 64, 2, 1.0),  # fewer valid points than k
    ],
)
def test_knn_points_matches_brute_force(b, nc, nt, k, d, spread):
    gen = torch.Generator().manual_seed(nc + k)
    xc = torch.rand(b, nc, d, generator=gen) * 12 - 6
    xc[0, : nc // 3] = xc[0, : nc // 3] * 0.05 + 2.0  # a dense cluster: cells of very different occupancy
    xt = (torch.rand(b, nt, d, generator=gen) * 12 - 6) * spread
    mask = torch.rand(b, nc, generator=gen) < 0.8
    index, valid = knn_points(xc, mask, xt, k)
    assert index.shape == valid.shape == (b, nt, k)
    reference = brute_force_knn(xc, mask, xt, k)
    kk = reference.shape[-1]
    got = torch.cdist(xt.double(), xc.double()).gather(2, index).masked_fill(~valid, float("inf"))
    torch.testing.assert_close(got[..., :kk], reference)  # the same distances, nearest first
    assert bool((mask.gather(1, index.flatten(1)).view_as(valid) | ~valid).all())  # never a padded point
    assert torch.equal(valid.sum(-1), mask.sum(-1, keepdim=True).clamp(max=k).expand(b, nt))


def test_knn_points_when_a_task_has_fewer_points_than_k_in_a_fine_grid():
    """One task with many points sets a fine hashing grid; the other task's few points must all be found."""
    gen = torch.Generator().manual_seed(5)
    xc = torch.rand(2, 3000, 2, generator=gen) * 10
    mask = torch.ones(2, 3000, dtype=torch.bool)
    mask[1, 7:] = False
    xt = torch.rand(2, 50, 2, generator=gen) * 10
    index, valid = knn_points(xc, mask, xt, 12)
    assert torch.equal(valid[1].sum(-1), torch.full((50,), 7))
    assert all(set(index[1, t][valid[1, t]].tolist()) == set(range(7)) for t in range(50))
    got = torch.cdist(xt.double(), xc.double()).gather(2, index).masked_fill(~valid, float("inf"))
    torch.testing.assert_close(got[0], brute_force_knn(xc, mask, xt, 12)[0])


def test_knn_points_on_degenerate_inputs():
    xc = torch.zeros(2, 5, 2)  # every point at one location: a box of extent 0
    mask = torch.tensor([[True] * 5, [False] * 5])
    index, valid = knn_points(xc, mask, torch.ones(2, 3, 2), 3)
    assert valid[0].all() and not valid[1].any()
    index, valid = knn_points(torch.zeros(1, 0, 2), torch.zeros(1, 0, dtype=torch.bool), torch.ones(1, 3, 2), 2)
    assert not valid.any() and index.shape == (1, 3, 2)
    with pytest.raises(ValueError, match="k must be >= 1"):
        knn_points(xc, mask, torch.ones(2, 3, 2), 0)


def bilinear_by_hand(lat: list[float], lon: list[float], table: dict, point: tuple[float, float]) -> float | None:
    """Bilinear interpolation at ``point`` from ``table[(i, j)]`` (missing nodes absent), written out."""

    def cell(axis: list[float], v: float) -> tuple[int, float]:
        if v <= axis[0]:
            return 0, 0.0
        if v >= axis[-1]:
            return len(axis) - 2, 1.0
        i = max(j for j in range(len(axis) - 1) if axis[j] <= v)
        return i, (v - axis[i]) / (axis[i + 1] - axis[i])

    (i, s), (j, t) = cell(lat, point[0]), cell(lon, point[1])
    num = den = 0.0
    for di, wi in ((0, 1 - s), (1, s)):
        for dj, wj in ((0, 1 - t), (1, t)):
            if (i + di, j + dj) in table:
                num += wi * wj * table[(i + di, j + dj)]
                den += wi * wj
    return num / den if den > 0 else None


def test_multilinear_matches_a_hand_written_bilinear_interpolation():
    lat, lon = [50.0, 51.0, 52.5, 53.0], [-3.0, -2.0, -1.0, 0.5, 2.0]  # a rectilinear, uneven grid
    gen = torch.Generator().manual_seed(0)
    nodes = [(i, j) for i in range(len(lat)) for j in range(len(lon))]
    missing = {(1, 2), (2, 2)}
    b = 2
    xs = torch.tensor([[lat[i], lon[j]] for i, j in nodes]).expand(b, -1, -1).clone()
    xs += 0.01 * torch.randn(xs.shape, generator=gen)  # points a little off their nodes are snapped to them
    ys = torch.randn(b, len(nodes), 1, generator=gen)
    mask = torch.tensor([n not in missing for n in nodes]).expand(b, -1).clone()
    xt = torch.stack([torch.rand(b, 50, generator=gen) * 4 + 49.5, torch.rand(b, 50, generator=gen) * 6 - 3.5], -1)
    axes = [torch.tensor(lat), torch.tensor(lon)]
    values, available = multilinear(axes, xs, ys, mask, xt)
    for bi in range(b):
        table = {n: float(ys[bi, m, 0]) for m, n in enumerate(nodes) if n not in missing}
        for t in range(xt.shape[1]):
            expected = bilinear_by_hand(lat, lon, table, (float(xt[bi, t, 0]), float(xt[bi, t, 1])))
            assert expected is not None and bool(available[bi, t])
            assert float(values[bi, t, 0]) == pytest.approx(expected, abs=1e-5)


def test_multilinear_reproduces_a_bilinear_function_and_marks_empty_cells():
    axes = [torch.linspace(0, 1, 5), torch.linspace(0, 2, 4), torch.linspace(-1, 1, 3)]
    grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(1, -1, 3)
    f = lambda x: 1 + 2 * x[..., 0] - x[..., 1] + 0.5 * x[..., 0] * x[..., 2]  # noqa: E731  (trilinear)
    xt = torch.rand(1, 40, 3) * torch.tensor([1.0, 2.0, 2.0]) + torch.tensor([0.0, 0.0, -1.0])
    values, available = multilinear(axes, grid, f(grid).unsqueeze(-1), torch.ones(1, grid.shape[1], dtype=bool), xt)
    torch.testing.assert_close(values[..., 0], f(xt), atol=1e-5, rtol=1e-5)
    assert available.all()
    _, available = multilinear(axes, grid, f(grid).unsqueeze(-1), torch.zeros(1, grid.shape[1], dtype=bool), xt)
    assert not available.any()


def test_inverse_distance_matches_a_hand_written_loop():
    gen = torch.Generator().manual_seed(1)
    xs, ys = torch.randn(2, 30, 2, generator=gen), torch.randn(2, 30, 2, generator=gen)
    mask = torch.rand(2, 30, generator=gen) < 0.7
    xt = torch.randn(2, 12, 2, generator=gen)
    xt[0, 0] = xs[0, mask[0].nonzero()[0, 0]]  # a target on a context point takes its value
    values, available = inverse_distance(xs, ys, mask, xt, k=5, power=2.0)
    assert available.all()
    for b in range(2):
        for t in range(12):
            near = sorted((math.dist(xt[b, t].tolist(), xs[b, n].tolist()), n) for n in range(30) if mask[b, n])[:5]
            w = [1 / (dist**2 + 1e-12) for dist, _ in near]
            expected = [
                sum(wi * float(ys[b, n, c]) for wi, (_, n) in zip(w, near, strict=True)) / sum(w) for c in range(2)
            ]
            assert values[b, t].tolist() == pytest.approx(expected, abs=1e-4)
    n0 = int(mask[0].nonzero()[0, 0])
    torch.testing.assert_close(values[0, 0], ys[0, n0], atol=1e-5, rtol=0)


def test_interpolation_decoder_combines_sources_with_learned_softmax_weights():
    gen = torch.Generator().manual_seed(2)
    lat, lon = torch.linspace(0, 3, 4), torch.linspace(0, 4, 5)
    grid_x = torch.stack(torch.meshgrid(lat, lon, indexing="ij"), -1).reshape(1, -1, 2).expand(2, -1, -1)
    grid_y = torch.randn(2, 20, 1, generator=gen)
    st_x, st_y = torch.rand(2, 6, 2, generator=gen) * 3, torch.randn(2, 6, 1, generator=gen)
    st_mask = torch.tensor([[True] * 6, [False] * 6])  # the second task has no station context
    decoder = InterpolationDecoder(
        dim=1, sources=["grid", "stations"], gridded={"grid": {"axes": [lat.tolist(), lon.tolist()]}}, k=3
    )
    with torch.no_grad():
        decoder.logits.copy_(torch.tensor([[0.3], [-0.4]]))
    state = Latent(
        torch.cat([grid_y, st_y], 1),
        mask=torch.cat([torch.ones(2, 20, dtype=torch.bool), st_mask], 1),
        x=torch.cat([grid_x, st_x], 1),
        source=torch.cat([torch.zeros(2, 20, dtype=torch.long), torch.ones(2, 6, dtype=torch.long)], 1),
    )
    xt = torch.rand(2, 9, 2, generator=gen) * 3
    out = decoder([state], torch.zeros(2, 9, 1), xt)
    g, _ = multilinear([lat, lon], grid_x, grid_y, torch.ones(2, 20, dtype=torch.bool), xt)
    s, _ = inverse_distance(st_x, st_y, st_mask, xt, 3, 2.0)
    pi = torch.softmax(torch.tensor([0.3, -0.4]), 0)
    torch.testing.assert_close(out[0], pi[0] * g[0] + pi[1] * s[0])
    torch.testing.assert_close(out[1], g[1])  # without stations the grid's interpolant has all the weight
    out.sum().backward()
    assert decoder.logits.grad is not None and decoder.logits.grad.abs().sum() > 0


def test_interp_preset_and_recipe_errors():
    model = create_model("interp", dim_x=2)
    assert count_parameters(model) == 4  # affine map (2), noise (1), source logit (1)
    ctx = Observations(torch.rand(2, 50, 2), torch.randn(2, 50, 1), torch.ones(2, 50, dtype=torch.bool))
    pred = model({"points": ctx}, ctx.x[:, :5])
    # On the context points themselves the interpolant is the observed value: the mean is its affine map.
    head = model.likelihood.head[0]
    torch.testing.assert_close(pred.mean, head(ctx.y[:, :5]).detach(), atol=1e-4, rtol=1e-4)
    with pytest.raises((ConfigError, ValueError), match="gridded names source"):
        build_model(
            {
                **create_model_spec(),
                "grid_decoder": {"name": "interpolation", "gridded": {"nope": {"axes": [[0.0, 1.0], [0.0, 1.0]]}}},
            }
        )
    with pytest.raises((ConfigError, ValueError), match="strictly increasing"):
        build_model(
            {
                **create_model_spec(),
                "grid_decoder": {"name": "interpolation", "gridded": {"points": {"axes": [[1.0, 0.0], [0.0]]}}},
            }
        )


def create_model_spec() -> dict:
    from gridtnp.models.specs import resolve_spec

    return resolve_spec({"preset": "interp", "dim_x": 2})
