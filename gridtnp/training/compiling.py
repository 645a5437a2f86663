"""``torch.compile`` of a model with an eager fallback: ``CompiledModel(model)(*args)``.

``torch.compile`` compiles lazily, on the first call with new input shapes, so a component it cannot compile
(or a machine without a C compiler for the CPU backend) fails at a call, not at construction. ``CompiledModel``
then runs that call eagerly; when the eager call succeeds the failure was the compiler's, so it warns once,
naming the reason, and runs eagerly from then on. An error that the eager model raises too (a user's wrong input)
propagates as it would without compiling.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn


class CompiledModel:
    """Calls ``torch.compile(model)``, falling back to ``model`` (with one warning) where compiling fails.

    Not an ``nn.Module`` on purpose: a module holding it registers no second copy of the parameters.
    """

    def __init__(self, model: nn.Module, **options: Any) -> None:
        self.model = model
        self.reason: str | None = None
        self.compiled: Any = None
        try:
            self.compiled = torch.compile(model, **options)
        except Exception as err:  # e.g. an unsupported Python version or backend
            self._fall_back(err)

    @property
    def active(self) -> bool:
        """Whether calls still go through the compiled model."""
        return self.compiled is not None

    def _fall_back(self, err: BaseException) -> None:
        self.compiled = None
        self.reason = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
        warnings.warn(
            f"torch.compile failed ({self.reason}); running the model eagerly (uncompiled) from now on.",
            RuntimeWarning,
            stacklevel=3,
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.compiled is None:
            return self.model(*args, **kwargs)
        try:
            return self.compiled(*args, **kwargs)
        except Exception as err:
            out = self.model(*args, **kwargs)  # raises again if the input, not the compiler, was at fault
            self._fall_back(err)
            return out


__all__ = ["CompiledModel"]
