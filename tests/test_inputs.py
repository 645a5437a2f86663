"""Inputs checked where they enter: non-finite values are missing, non-finite target locations are refused, and a
gridded model says when it is asked about points beyond its grid."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import xarray as xr

from gridtnp.batch import Batch, BatchError, Observations
from gridtnp.inference import predict
from gridtnp.models import create_model
from gridtnp.nn.likelihoods import log_likelihood


def test_infinite_context_values_and_locations_are_missing_like_nan():
    torch.manual_seed(0)
    model = create_model("tnp", dim=16, layers=1).eval()
    x, y, xt = torch.randn(2, 6, 1), torch.randn(2, 6, 1), torch.randn(2, 4, 1)
    for bad in (float("inf"), float("-inf")):
        y_bad, x_bad = y.clone(), x.clone()
        y_bad[0, 2], x_bad[1, 3] = bad, bad
        y_nan, x_nan = y.clone(), x.clone()
        y_nan[0, 2], x_nan[1, 3] = float("nan"), float("nan")
        out = model({"points": Observations(x_bad, y_bad)}, xt).mean
        ref = model({"points": Observations(x_nan, y_nan)}, xt).mean
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, ref)


def test_infinite_target_values_are_left_out_of_the_log_likelihood():
    dist = torch.distributions.Normal(torch.zeros(1, 3, 1), torch.ones(1, 3, 1))
    target = Observations(torch.zeros(1, 3, 1), torch.tensor([[[0.0], [float("inf")], [1.0]]]))
    loglik = log_likelihood(dist, target.y, target.valid())
    expected = -0.5 * np.log(2 * np.pi) - 0.25  # mean of log N(0; 0, 1) and log N(1; 0, 1)
    torch.testing.assert_close(loglik, torch.tensor([expected], dtype=torch.float32))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_target_without_a_location_is_refused_but_a_masked_one_is_not(bad):
    context = {"points": Observations(torch.randn(1, 3, 1), torch.randn(1, 3, 1))}
    xt = torch.randn(1, 4, 1)
    xt[0, 2] = bad
    with pytest.raises(BatchError, match=r"target.x has a NaN or infinite location \(task 0, point 2\)"):
        Batch(context, Observations(xt))
    mask = torch.tensor([[True, True, False, True]])
    Batch(context, Observations(xt, mask=mask))  # a padded slot may hold anything


def test_gridded_predictions_warn_beyond_the_grid():
    torch.manual_seed(0)
    model = create_model("swin_tnp", dim=16, grid_size=8, bound=1.0, window=4, layers=1)
    rng = np.random.default_rng(0)
    points = xr.DataArray(
        rng.standard_normal(5), dims=("point",),
        coords={"x0": ("point", rng.uniform(-1, 1, 5)), "x1": ("point", rng.uniform(-1, 1, 5))},
    )  # fmt: skip
    inside = xr.Dataset(coords={"x0": np.linspace(-1, 1, 3), "x1": np.linspace(-1, 1, 3)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        predict(model, {"points": points}, inside, coords=("x0", "x1"))
    far = xr.Dataset(coords={"x0": [0.0, 500.0], "x1": [0.0]})
    with pytest.warns(UserWarning, match=r"targets lie outside the model's grid along input dimension 0 by up to 499"):
        predict(model, {"points": points}, far, coords=("x0", "x1"))


def test_float64_inputs_are_computed_in_float32():
    torch.manual_seed(0)
    model = create_model("tnp", dim=16, layers=1).eval()
    x, y, xt = torch.randn(2, 6, 1), torch.randn(2, 6, 1), torch.randn(2, 4, 1)
    single = model({"points": Observations(x, y)}, xt).mean
    double = model({"points": Observations(x.double(), y.double())}, xt.double()).mean
    assert double.dtype == torch.float32
    torch.testing.assert_close(double, single)


def test_a_full_disk_during_a_checkpoint_write_is_one_error_and_keeps_the_previous(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from gridtnp.training import checkpointing

    path = tmp_path / "last.ckpt"
    io = checkpointing.AtomicCheckpointIO()
    io.save_checkpoint({"step": 1}, path)

    def full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file")

    monkeypatch.setattr(checkpointing.torch, "save", full)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9, 0))
    with pytest.raises(checkpointing.CheckpointError, match=r"cannot write checkpoint .*last.ckpt: no space left"):
        io.save_checkpoint({"step": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) == {"step": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no temporary left behind
