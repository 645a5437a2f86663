"""``compile: true`` (gridtnp.training.compiling.CompiledModel): the eager fallback and its one warning.

Real compilation takes minutes on a small CPU, so these tests replace ``torch.compile`` by stand-ins; the speed-up
of the real thing is measured in benchmarks (docs/performance.md).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from gridtnp import NeuralProcessModule
from gridtnp.training.compiling import CompiledModel


class Broken:
    """A compiled model whose every call fails as a compiler would."""

    def __init__(self, model: nn.Module, **_: object) -> None:
        self.calls = 0

    def __call__(self, *args: object) -> None:
        self.calls += 1
        raise RuntimeError("backend compiler failed\nlong traceback")


def test_compile_failure_falls_back_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "compile", Broken)
    model = nn.Linear(3, 2)
    run = CompiledModel(model)
    x = torch.randn(4, 3)
    with pytest.warns(RuntimeWarning, match=r"torch.compile failed \(RuntimeError: backend compiler failed\)"):
        out = run(x)
    torch.testing.assert_close(out, model(x))
    assert not run.active and run.reason == "RuntimeError: backend compiler failed"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning: later calls go straight to the eager model
        torch.testing.assert_close(run(x), model(x))


def test_compile_unavailable_at_construction_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable(*_: object, **__: object) -> None:
        raise RuntimeError("Dynamo is not supported on this Python")

    monkeypatch.setattr(torch, "compile", unavailable)
    with pytest.warns(RuntimeWarning, match="Dynamo is not supported"):
        run = CompiledModel(nn.Identity())
    assert run(torch.ones(2)).tolist() == [1.0, 1.0]


def test_an_input_error_is_not_blamed_on_the_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "compile", lambda model, **_: model)  # "compiled" = the model itself
    run = CompiledModel(nn.Linear(3, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
            run(torch.randn(4, 5))
    assert run.active


def test_module_compile_option_keeps_one_copy_of_the_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake_compile(model: nn.Module, **_: object):
        calls.append(model)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    spec = {"preset": "cnp", "dim_x": 1, "dim_y": 1}
    plain, compiled = NeuralProcessModule(**spec), NeuralProcessModule(**spec, compile=True)
    assert calls == [compiled.model] and compiled.hparams["compile"] is True
    assert list(plain.state_dict()) == list(compiled.state_dict())
    assert compiled.compiled is not None and plain.compiled is None
