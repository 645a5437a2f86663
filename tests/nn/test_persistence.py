"""The ``persistence`` baseline: a target's own context value where its station is in the context, else the nearest
value of the grid source; one learned variance."""

from __future__ import annotations

import math

import torch

from gridtnp.nn.grid_decoders.persistence import PersistenceDecoder
from gridtnp.nn.tokens import Latent


def test_persistence_carries_the_station_value_else_the_grid_value() -> None:
    grid_x = torch.tensor([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    grid_y = torch.tensor([1.0, 2.0, 3.0, 4.0])
    station_x, station_y = torch.tensor([[0.1, 0.9], [0.9, 0.2]]), torch.tensor([10.0, 20.0])
    x = torch.cat([grid_x, station_x])[None]
    z = torch.cat([grid_y, station_y])[None, :, None]
    source = torch.tensor([[0, 0, 0, 0, 1, 1]])
    mask = torch.tensor([[True, True, True, True, True, False]])  # the second station is not in this context
    state = [Latent(z, mask=mask, x=x, source=source)]
    decoder = PersistenceDecoder(sources=["grid", "stations"], init_variance=0.5)
    xt = torch.tensor([[[0.1, 0.9], [0.9, 0.2], [0.95, 0.9]]])
    out = decoder(state, torch.zeros(1, 3, 2), xt)
    # At the first station its own value; at the second (masked out) and elsewhere the nearest grid value.
    torch.testing.assert_close(out[0, :, 0], torch.tensor([10.0, 3.0, 4.0]))
    torch.testing.assert_close(out[0, :, 1], torch.full((3,), math.log(0.5)))
    assert [n for n, p in decoder.named_parameters()] == ["log_var"]
