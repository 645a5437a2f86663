"""The persistence baseline as a grid decoder: ``persistence``.

Interface: ``decoder(states: list[Latent], zt [B, Nt, D], xt [B, Nt, Dx]) -> [B, Nt, 2]`` (mean, log variance), read
by the ``direct`` likelihood; reads the context set kept by the ``identity`` encoder, grid encoder and processor
(tokens = the values), like ``mos``, and ignores ``zt``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from gridtnp.nn.grid_decoders.gridded import gather_rows
from gridtnp.nn.grid_decoders.interpolation import check_final
from gridtnp.nn.neighbours import knn_points
from gridtnp.nn.tokens import Latent
from gridtnp.registry import register


@register("grid_decoder", "persistence")
class PersistenceDecoder(nn.Module):
    """Persistence: each target's last known value, with one learned variance.

    The mean at a target is the value of the context point of ``station_source`` at the target's own location
    (within ``tolerance``): the station's own report, e.g. at a forecast's initial hour, carried to every lead. Where
    the station is not in the context it is the value of the nearest point of ``grid_source`` (its coarse cell's
    value). The log variance is one learned number (fitted by the training loop's likelihood; refit per lead by
    training one model per lead). No other parameter: the baseline a forecast has to beat. It sees locations, not
    times: give forecast tasks one context hour (``task.context_hours: [0, 0]``), so that a station's context value
    is its last one. Needs the ``identity`` encoder, grid encoder and processor and the ``direct`` likelihood.

    Args:
        dim: output width, 2 (mean and log variance; the model's dim).
        in_dim: width of the context tokens (the ``identity`` encoder's ``dim_y``; passed by the model).
        sources: names of the context sources in the model's order (passed by the model).
        station_source: the source whose value at a target's own location is carried forward.
        grid_source: the source whose nearest value stands in where the station is not in the context.
        tolerance: largest difference of any coordinate between a target and a station taken as the same place.
        init_variance: initial predictive variance.
        layers: must be 1 (the final state only); the model passes the processor's number of states.
    """

    def __init__(
        self,
        dim: int = 2,
        in_dim: int | None = None,
        sources: Sequence[str] | None = None,
        station_source: str = "stations",
        grid_source: str = "grid",
        tolerance: float = 1e-4,
        init_variance: float = 1.0,
        layers: int = 1,
    ) -> None:
        super().__init__()
        check_final("persistence", layers)
        self.sources = list(sources) if sources is not None else ["points"]
        missing = [s for s in (station_source, grid_source) if s not in self.sources]
        if missing or dim != 2 or (in_dim is not None and in_dim != 1) or not init_variance > 0 or tolerance < 0:
            raise ValueError(
                f"grid decoder 'persistence': needs station_source and grid_source among the context sources "
                f"{self.sources} (missing: {missing}), dim 2 (mean, log variance), one-value tokens (encoder "
                f"'identity', dim_y 1), init_variance > 0 and tolerance >= 0; got dim {dim}, in_dim {in_dim}, "
                f"init_variance {init_variance}, tolerance {tolerance}."
            )
        self.station_index, self.grid_index = self.sources.index(station_source), self.sources.index(grid_source)
        self.tolerance = float(tolerance)
        self.log_var = nn.Parameter(torch.tensor(float(init_variance)).log())

    def forward(self, states: list[Latent], zt: Tensor, xt: Tensor) -> Tensor:
        state = states[-1]
        if state.grid is not None or state.mask is None:
            raise ValueError(
                "grid decoder 'persistence' reads the context set: use encoder, grid encoder and processor 'identity'."
            )
        x, (z, mask) = state.locations("grid decoder 'persistence'"), state.as_set()
        source = state.source if state.source is not None else torch.zeros_like(mask, dtype=torch.long)
        values = z[..., :1].float()  # [B, N, 1]
        nearest = []
        for s in (self.station_index, self.grid_index):  # two sources, not points
            index, valid = knn_points(x, mask & (source == s), xt, 1)  # [B, Nt, 1]
            nearest.append((index, valid[..., 0]))
        (at_station, station_ok), (at_grid, grid_ok) = nearest
        gap = (gather_rows(x.detach().float(), at_station)[..., 0, :] - xt.detach().float()).abs().amax(-1)
        same_place = station_ok & (gap <= self.tolerance)  # [B, Nt]
        station = gather_rows(values, at_station)[..., 0, 0]
        grid = torch.where(grid_ok, gather_rows(values, at_grid)[..., 0, 0], 0.0)
        mean = torch.where(same_place, station, grid)
        return torch.stack([mean, self.log_var.expand_as(mean)], -1).to(zt.dtype)
