"""Station placement (``gridtnp.inference.placement``): the greedy choice against an exact GP's variance reduction,
written out here with numpy, and the candidates file's checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.distributions import Normal

from gridtnp.batch import Observations
from gridtnp.inference.placement import box_points, greedy_placement, placement_table, read_candidates
from gridtnp.registry import ConfigError

LENGTHSCALE, NOISE = 0.7, 0.1


class ExactGP(torch.nn.Module):
    """The posterior predictive of a zero-mean GP (SE kernel, unit scale, Gaussian noise) with the neural
    processes' interface: ``model(context, xt) -> Normal [B, Nt, 1]``; padded context points are left out."""

    def forward(self, context: dict[str, Observations], xt: torch.Tensor) -> Normal:
        obs = context["points"]
        means, stds = [], []
        for b in range(xt.shape[0]):  # an oracle for the test, not a hot path
            keep = obs.mask[b]
            xc, yc, x = obs.x[b][keep].double(), obs.y[b][keep].double(), xt[b].double()
            kcc = torch.exp(-0.5 * torch.cdist(xc, xc) ** 2 / LENGTHSCALE**2) + NOISE**2 * torch.eye(len(xc))
            kct = torch.exp(-0.5 * torch.cdist(xc, x) ** 2 / LENGTHSCALE**2)
            solved = torch.linalg.solve(kcc, kct)
            means.append(solved.T @ yc)
            stds.append((1.0 + NOISE**2 - (kct * solved).sum(0)).sqrt()[:, None])
        return Normal(torch.stack(means), torch.stack(stds))


def exact_variance(context: np.ndarray, region: np.ndarray) -> float:
    """Mean posterior predictive variance at ``region [M, 2]`` given noisy observations at ``context [N, 2]``."""
    d2 = ((context[:, None] - context[None]) ** 2).sum(-1)
    kcc = np.exp(-0.5 * d2 / LENGTHSCALE**2) + NOISE**2 * np.eye(len(context))
    kcr = np.exp(-0.5 * ((context[:, None] - region[None]) ** 2).sum(-1) / LENGTHSCALE**2)
    return float(np.mean(1.0 + NOISE**2 - np.einsum("nm,nm->m", kcr, np.linalg.solve(kcc, kcr))))


def exact_greedy(hours: list[np.ndarray], region: np.ndarray, candidates: np.ndarray, count: int):
    """The greedy order by the exact GP's variance reduction (it does not depend on the values observed)."""
    chosen, gains = [], []
    for _ in range(count):
        sites = candidates[chosen]
        before = np.mean([exact_variance(np.r_[c, sites], region) for c in hours])
        after = np.full(len(candidates), np.inf)
        for i in set(range(len(candidates))) - set(chosen):
            after[i] = np.mean([exact_variance(np.r_[c, sites, candidates[i : i + 1]], region) for c in hours])
        best = int(np.argmin(after))
        chosen.append(best)
        gains.append(before - after[best])
    return chosen, gains


def gp_context(rng: np.random.Generator) -> tuple[dict[str, Observations], list[np.ndarray]]:
    """Two hours of context: 6 stations, and 3 stations padded to 6; values drawn at random (the GP's variance
    does not depend on them, its mean does)."""
    x = rng.uniform(-2, 2, (2, 6, 2))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 3:] = False
    y = torch.from_numpy(rng.normal(size=(2, 6, 1)))
    context = {"points": Observations(torch.from_numpy(x), y, mask, "points")}
    return context, [x[0], x[1, :3]]


@pytest.mark.parametrize("max_tasks", [5, 1000])
def test_greedy_choice_matches_the_exact_gp_variance_reduction(max_tasks: int) -> None:
    rng = np.random.default_rng(3)
    context, hours = gp_context(rng)
    region = box_points([-2.0, -2.0], [2.0, 2.0], [5, 5])
    candidates = rng.uniform(-2.5, 2.5, (24, 2))
    expected, expected_gains = exact_greedy(hours, region, candidates, 3)

    placement = greedy_placement(
        ExactGP(), context, torch.from_numpy(region), torch.from_numpy(candidates), 3, max_tasks=max_tasks
    )
    assert placement.index.tolist() == expected
    np.testing.assert_allclose(placement.gains, expected_gains, rtol=1e-6)
    np.testing.assert_allclose(placement.sites, candidates[expected])
    assert np.all(np.diff(placement.variance) < 0) and np.all(placement.gains > 0)
    np.testing.assert_allclose(placement.variance[0] - placement.variance[1:], np.cumsum(expected_gains), rtol=1e-6)
    # Every candidate's first-round gain is the exact one; the first choice is their maximum.
    first = [
        np.mean([exact_variance(c, region) for c in hours])
        - np.mean([exact_variance(np.r_[c, candidates[i : i + 1]], region) for c in hours])
        for i in range(len(candidates))
    ]
    np.testing.assert_allclose(placement.first_gains, first, rtol=1e-6)
    assert placement.std_after.mean() < placement.std_before.mean()


def test_placement_table_lists_the_sites_in_order_with_gains() -> None:
    rng = np.random.default_rng(0)
    context, _ = gp_context(rng)
    candidates = box_points([-2.0, -2.0], [2.0, 2.0], [3, 3])
    placement = greedy_placement(
        ExactGP(), context, torch.from_numpy(box_points([-2, -2], [2, 2], [4, 4])), torch.from_numpy(candidates), 2
    )
    table = placement_table(placement, ["x0", "x1"], [f"c{i}" for i in range(9)], scale=2.0, units="K")
    assert table["round"].tolist() == [1, 2]
    assert table["name"].tolist() == [f"c{i}" for i in placement.index]
    np.testing.assert_allclose(table["gain_physical"], 4.0 * placement.gains)
    np.testing.assert_allclose(table["variance_before"] - table["variance_after"], table["gain"])


def test_count_beyond_the_candidates_is_refused() -> None:
    context, _ = gp_context(np.random.default_rng(0))
    with pytest.raises(ConfigError, match="count 5: expected 1 to the number of candidates"):
        greedy_placement(ExactGP(), context, torch.zeros(4, 2), torch.zeros(3, 2), 5)


def test_candidates_file_columns(tmp_path: Path) -> None:
    good = tmp_path / "sites.csv"
    good.write_text("name,Lat,lon\nA,51.5,-0.1\nB,53.4,-2.2\n")
    values, names = read_candidates(good, ["latitude", "longitude"])
    assert names == ["A", "B"] and values.tolist() == [[51.5, -0.1], [53.4, -2.2]]
    bad = tmp_path / "bad.csv"
    bad.write_text("site,north,east\nA,51.5,-0.1\n")
    with pytest.raises(ConfigError, match=r"no column latitude, longitude; .* it has site, north, east") as err:
        read_candidates(bad, ["latitude", "longitude"])
    assert "\n" not in str(err.value)
    missing = tmp_path / "missing.csv"
    missing.write_text("latitude,longitude\n51.5,\n")
    with pytest.raises(ConfigError, match="row 2 has a missing or non-numeric value"):
        read_candidates(missing, ["latitude", "longitude"])
