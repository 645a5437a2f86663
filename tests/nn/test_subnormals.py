"""No subnormal float reaches a matrix product of the kernel paths on the gridded TNP paper's 2-D GP workload, and
flooring the kernel values changes no prediction.

Subnormal operands make Intel's GEMM many times slower (the dense KI-GE ran 5x slower than the reference there), so
the check is on the values, not on a time: a dispatch mode counts subnormal entries in every operand of ``mm``,
``bmm``, ``addmm`` and ``baddbmm`` during a forward pass, and in every softmax output of the residual layer.
"""

from pathlib import Path

import pytest
import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode

import gridtnp
from gridtnp.batch import Observations
from gridtnp.nn.residuals import InterpolationResidual

ROOT = Path(__file__).resolve().parents[2]
aten = torch.ops.aten
PRODUCTS = {aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default}


def subnormal_count(values: torch.Tensor) -> int:
    """Entries of ``values`` that are nonzero and below the type's smallest normal number."""
    magnitude = values.abs()
    return int(((magnitude > 0) & (magnitude < torch.finfo(values.dtype).tiny)).sum())


class SubnormalOperands(TorchDispatchMode):
    """Counts subnormal entries per operator: operands of matrix products, and outputs of ``watch_outputs``."""

    def __init__(self, watch_outputs: frozenset = frozenset()) -> None:
        super().__init__()
        self.watch_outputs = watch_outputs
        self.counts: dict[str, int] = {}
        self.calls: dict[str, int] = {}

    def _count(self, func, tensors) -> None:
        name = str(func)
        self.calls[name] = self.calls.get(name, 0) + 1
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                self.counts[name] = self.counts.get(name, 0) + subnormal_count(t)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in PRODUCTS:
            self._count(func, args)
        if func in self.watch_outputs:
            self._count(func, [out])
        return out


def paper_model(recipe: str) -> torch.nn.Module:
    """The model of ``recipes/<recipe>`` with seeded weights, in eval mode."""
    torch.manual_seed(0)
    config = yaml.safe_load((ROOT / "recipes" / recipe).read_text())
    return gridtnp.NeuralProcessModule(**config["model"]["init_args"]).model.eval()


def paper_workload(nc: int = 10_000, nt: int = 1_000) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``xc [2, nc, 2]``, ``yc [2, nc, 1]``, ``xt [2, nt, 2]``: x ~ U[-6, 6]^2, y ~ N(0, 1) (the paper's 2-D GP)."""
    g = torch.Generator().manual_seed(0)
    xc = -6.0 + 12.0 * torch.rand(2, nc, 2, generator=g)
    return xc, torch.randn(2, nc, 1, generator=g), -6.0 + 12.0 * torch.rand(2, nt, 2, generator=g)


@pytest.mark.parametrize("recipe", ["gp2d_swin_ki.yaml", "gp2d_convcnp.yaml"])
def test_no_subnormal_operand_in_the_kernel_models(recipe: str) -> None:
    model = paper_model(recipe)
    xc, yc, xt = paper_workload()
    with torch.no_grad(), SubnormalOperands() as probe:
        model({"points": Observations(xc, yc)}, xt)
    assert sum(probe.calls.values()) > 0, "no matrix product ran: the probe saw nothing"
    assert not any(probe.counts.values()), f"subnormal operands per operator: {probe.counts}"


@pytest.mark.parametrize("recipe", ["gp2d_swin_ki.yaml", "gp2d_convcnp.yaml"])
def test_flooring_changes_no_prediction(recipe: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from gridtnp.nn import gaussian

    model = paper_model(recipe)
    xc, yc, xt = paper_workload(nc=3_000, nt=500)
    with torch.no_grad():
        floored = model({"points": Observations(xc, yc)}, xt)
        monkeypatch.setattr(gaussian, "FLOOR_EXPONENT", 1e6)  # a floor far below any float: nothing cut
        exact = model({"points": Observations(xc, yc)}, xt)
    torch.testing.assert_close(floored.mean, exact.mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(floored.stddev, exact.stddev, rtol=1e-6, atol=1e-6)


def test_residual_interpolation_weights_stay_normal() -> None:
    torch.manual_seed(0)
    # Neighbours many length-scales apart, as stations far from a target: weights down to exp(-0.5 * 60^2).
    xc, yc = torch.rand(2, 400, 2) * 60, torch.randn(2, 400, 1)
    xt = torch.rand(2, 300, 2) * 60
    interp = InterpolationResidual(["s"], dim_y=1, source_dims={"s": 1}, k=16, lengthscale={"s": 0.2})
    with torch.no_grad(), SubnormalOperands(frozenset({aten._softmax.default})) as probe:
        out, share, _ = interp({"s": (xc, yc, torch.ones(2, 400, dtype=torch.bool))}, xt)
    assert probe.calls.get(str(aten._softmax.default), 0) > 0
    assert not any(probe.counts.values()), f"subnormal weights per operator: {probe.counts}"
    assert torch.isfinite(out).all() and torch.allclose(share, torch.ones_like(share))
