"""Multi-layer perceptrons, the feed-forward part of every stage: ``mlp(dim_in, dim_out, hidden, layers)``.

``NarrowLinear`` is ``nn.Linear`` with a faster CPU backward for inputs of a few features (coordinates, values);
``mlp`` starts with one when its input has at most ``NARROW_INPUT`` features.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class NarrowLinear(nn.Linear):
    """``nn.Linear`` for inputs with a few features (coordinates, values): the same map and parameters.

    ``nn.Linear``'s backward forms the weight gradient as ``g^T x`` (``[out, N] @ [N, in]``, the weight's layout);
    with a handful of input features and ``N`` in the tens of thousands (every context point) that product is
    several times slower on the CPU than ``x^T g`` (``[in, N] @ [N, out]``: 0.5 against 3.4 ms at ``N = 20,000``,
    ``in = 4``, ``out = 128``), which ``addmm`` forms when its weight operand is a contiguous ``[in, out]`` matrix:
    here a copy of ``in x out`` numbers per call.
    """

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight.t().contiguous().t(), self.bias)


NARROW_INPUT = 8  # an MLP whose input has at most this many features starts with a NarrowLinear


def mlp(
    dim_in: int, dim_out: int, hidden: int, layers: int = 2, activation: type[nn.Module] = nn.GELU
) -> nn.Sequential:
    """An MLP with ``layers`` linear layers (``layers - 1`` hidden layers of width ``hidden``)."""
    if layers < 1:
        raise ValueError(f"mlp needs at least one layer; got layers={layers}.")
    dims = [dim_in] + [hidden] * (layers - 1) + [dim_out]
    modules: list[nn.Module] = []
    for i in range(layers):
        linear = NarrowLinear if i == 0 and dim_in <= NARROW_INPUT else nn.Linear
        modules.append(linear(dims[i], dims[i + 1]))
        if i < layers - 1:
            modules.append(activation())
    return nn.Sequential(*modules)
