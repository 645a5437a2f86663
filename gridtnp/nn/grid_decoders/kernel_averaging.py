"""Gaussian kernel averaging (GKA) as a grid decoder: ``gka``.

Interface: ``decoder(states: list[Latent], zt [B, Nt, D], xt [B, Nt, Dx]) -> [B, Nt, D]``; reads the final state
only (``layers = 1``) and ignores ``zt``. With the ``identity`` encoder, grid encoder and processor and the
``homoscedastic`` likelihood with ``layers: 1`` it is the attention-models thesis's GKA baseline (presets ``gka``,
``gka_knn``); on a grid state (the grid points as the locations) it can replace a gridded model's decoder.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gridtnp.nn.attention import attention_mask
from gridtnp.nn.gaussian import floor_logits
from gridtnp.nn.grid_decoders.gridded import gather_rows
from gridtnp.nn.grid_decoders.interpolation import check_final
from gridtnp.nn.grids import Grid
from gridtnp.nn.mlp import mlp
from gridtnp.nn.neighbours import knn_points
from gridtnp.nn.tokens import Latent
from gridtnp.registry import register


def gka_logits(xq: Tensor, xk: Tensor, grid: Grid | None, scale: Tensor) -> Tensor:
    """``-0.5 sum_d ((x_q,d - x_k,d) / scale_d)^2`` for ``xq, xk [..., d]`` (broadcast); rolled ``grid`` dims wrap."""
    diff = xq - xk if grid is None else grid.difference(xq, xk)
    return -0.5 * (diff / scale).square().sum(-1)


@register("grid_decoder", "gka")
class GKADecoder(nn.Module):
    """Gaussian kernel averaging (GKA): each target gets the kernel-weighted mean of the context tokens.

    The attention-models thesis's baseline (Chapter 1): with length-scales ``sigma_d`` learned per input dimension,
    ``out(x_t) = sum_n w_n z_n / sum_n w_n`` with ``w_n = exp(-0.5 sum_d ((x_t,d - x_n,d) / sigma_d)^2 + g(x_n))``;
    ``g = 0``, or an MLP of the context location for the GKA-MLP variant (``modulate``), which lets where a point is
    raise or lower its weight. ``lengthscale_mlp`` is the thesis's eq. 1.2 read literally: the length-scales are a
    function of the location, ``sigma(x_t) = sigma * exp(MLP(x_t))`` per dimension at each target (the MLP starts at
    0, so training starts from plain GKA); its neighbours are searched with the base ``sigma``. Reads a set state
    with locations (``identity`` grid encoder: the context itself) or a grid state (the grid points; rolled
    dimensions wrap). With ``k`` null every context point counts (one SDPA call with queries ``[x_t / sigma, 1]``
    and keys ``[x_n / sigma, -|x_n / sigma|^2 / 2 + g]``, O(N_t N_c) time, no distance matrix held on kernels that
    fuse it); with ``k`` only each target's ``k`` nearest in the scaled metric: cell lists for sets
    (``gridtnp.nn.neighbours.knn_points``, exact; a target whose nearby cells hold fewer than ``k`` points searches
    wider rings), index arithmetic for grids (``Grid.neighbours``, the ``ceil(k^(1/d))^d`` block around the target).
    A target without any valid context gets 0. Output ``[B, Nt, dim]``: the average itself when ``dim`` equals the
    width of the averaged tokens, else a Linear of it.

    Args:
        grid: the grid of grid states (passed by the model); unused for set states.
        dim: output width D (the model's dim).
        in_dim: width of the averaged tokens (passed by the model: the encoders'; set it to the processor's width,
            the model's dim, when decoding a gridded model's states); null: ``dim``.
        dim_x: input dimension Dx (sizes the length-scales and the ``modulate`` MLP).
        lengthscale: starting sigma in input units, one value or one per dimension; > 0.
        learn_lengthscale: learn sigma; false keeps the starting values.
        k: average over each target's ``k`` nearest context points only; null for all of them.
        modulate: GKA-MLP: add an MLP of the context location to the log-weights.
        hidden: hidden width of the ``modulate`` and ``lengthscale_mlp`` MLPs.
        lengthscale_mlp: GKA-MLP as a length-scale field: ``sigma(x_t) = sigma * exp(MLP(x_t))`` per dimension.
        layers: must be 1 (the final state only); the model passes the processor's number of states.
    """

    def __init__(
        self,
        grid: Grid | None = None,
        dim: int = 1,
        in_dim: int | None = None,
        dim_x: int = 1,
        lengthscale: float | Sequence[float] = 1.0,
        learn_lengthscale: bool = True,
        k: int | None = None,
        modulate: bool = False,
        hidden: int = 64,
        layers: int = 1,
        lengthscale_mlp: bool = False,
    ) -> None:
        super().__init__()
        check_final("gka", layers)
        values = (
            [float(lengthscale)] * dim_x if isinstance(lengthscale, (int, float)) else list(map(float, lengthscale))
        )
        if len(values) != dim_x or not all(v > 0 for v in values):
            raise ValueError(
                f"grid decoder 'gka': lengthscale must be one positive number or {dim_x} (one per input dimension); "
                f"got {lengthscale!r}."
            )
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"grid decoder 'gka': k must be an integer >= 1 or null (every point); got {k!r}.")
        log_l = torch.tensor(values).log()
        if learn_lengthscale:
            self.log_lengthscale = nn.Parameter(log_l)
        else:
            self.register_buffer("log_lengthscale", log_l)
        self.grid, self.k = grid, k
        self.modulation = mlp(dim_x, 1, hidden, 2) if modulate else None
        self.scale_field = None
        if lengthscale_mlp:
            self.scale_field = mlp(dim_x, dim_x, hidden, 2, activation=nn.ReLU)
            nn.init.zeros_(self.scale_field[-1].weight)
            nn.init.zeros_(self.scale_field[-1].bias)
        self.in_dim = dim if in_dim is None else in_dim
        self.proj = nn.Identity() if self.in_dim == dim else nn.Linear(self.in_dim, dim)

    @property
    def lengthscale(self) -> Tensor:
        """Current per-dimension length-scales sigma ``[Dx]``."""
        return self.log_lengthscale.exp()

    def forward(self, states: list[Latent], zt: Tensor, xt: Tensor) -> Tensor:
        return self.proj(self._gka(states[-1], xt))

    def _gka(self, state: Latent, xt: Tensor) -> Tensor:
        """The kernel-weighted mean ``[B, Nt, in_dim]`` of the tokens of ``state`` at ``xt``."""
        grid = None
        if state.mask is None and state.x is None:  # grid tokens: the grid points are the locations
            grid = state.grid or self.grid
            if grid is None or tuple(state.tokens.shape[1:-1]) != grid.shape:
                raise ValueError(f"grid decoder 'gka' got grid tokens {tuple(state.tokens.shape)} without their grid.")
            z, mask = state.as_set()
            x = grid.points(z.device).reshape(1, -1, grid.ndim).expand(z.shape[0], -1, -1)
        else:
            x, (z, mask) = state.locations("grid decoder 'gka'"), state.as_set()
        if z.shape[-1] != self.in_dim:
            raise ValueError(
                f"grid decoder 'gka' was built with in_dim={self.in_dim} but the tokens are {z.shape[-1]} wide; set "
                "in_dim to the width of the states it reads (the model's dim after a processor)."
            )
        if x.shape[-1] != self.log_lengthscale.numel() or xt.shape[-1] != x.shape[-1]:
            raise ValueError(
                f"grid decoder 'gka' was built for dim_x={self.log_lengthscale.numel()}; got context x "
                f"{tuple(x.shape)} and target x {tuple(xt.shape)}."
            )
        scale = self.lengthscale.float()
        x, xt = torch.where(mask.unsqueeze(-1), x.float(), 0.0), xt.float()
        bias = self.modulation(x).squeeze(-1).float() if self.modulation is not None else x.new_zeros(x.shape[:2])
        target_scale = scale
        if self.scale_field is not None:  # sigma(x_t) [B, Nt, 1, d]
            target_scale = (scale * self.scale_field(xt).float().exp()).unsqueeze(-2)
        if self.k is None and (grid is None or not any(grid.roll)) and self.scale_field is None:
            return self._dense(x, xt, bias, z, mask, scale)
        if self.k is None:  # every pair, [B, Nt, M] (wrapped differences or per-target scales: no dot product)
            logits = gka_logits(xt.unsqueeze(2), x.unsqueeze(1), grid, target_scale) + bias.unsqueeze(1)
            valid = mask.unsqueeze(1).expand_as(logits)
            return self._average(logits, valid, z.unsqueeze(1).expand(-1, xt.shape[1], -1, -1))
        if grid is not None:
            index, valid = grid.neighbours(xt, self.k)  # the block of grid points around each target
        else:
            centre = masked_centre(x, mask)
            index, valid = knn_points((x - centre) / scale, mask, (xt - centre) / scale, self.k)
        logits = gka_logits(xt.unsqueeze(-2), gather_rows(x, index), grid, target_scale)
        logits = logits + gather_rows(bias.unsqueeze(-1), index)[..., 0]
        return self._average(logits, valid, gather_rows(z, index))

    @staticmethod
    def _average(logits: Tensor, valid: Tensor, values: Tensor) -> Tensor:
        """Softmax over the last axis of ``logits, valid [B, Nt, K]`` applied to ``values [B, Nt, K, D]``."""
        logits = floor_logits(logits.masked_fill(~valid, float("-inf")))
        weights = torch.softmax(logits, -1).nan_to_num(0.0)  # no key: 0
        return (weights.unsqueeze(-2).to(values.dtype) @ values).squeeze(-2)

    @staticmethod
    def _dense(x: Tensor, xt: Tensor, bias: Tensor, z: Tensor, mask: Tensor, scale: Tensor) -> Tensor:
        """Every context point, as one SDPA call: ``-|q - k|^2 / 2 = q.k - |k|^2 / 2 - |q|^2 / 2``, and the last
        term is the same for every key of a query, so softmax drops it. Coordinates are centred on the context
        first, which keeps the cancellation in ``|k|^2`` small."""
        centre = masked_centre(x, mask)
        xs, xq = (x - centre) / scale, (xt - centre) / scale
        q = torch.cat([xq, torch.ones_like(xq[..., :1])], -1).unsqueeze(1)  # [B, 1, Nt, d + 1]
        k = torch.cat([xs, (bias - 0.5 * xs.square().sum(-1)).unsqueeze(-1)], -1).unsqueeze(1)  # [B, 1, N, d + 1]
        attn_mask, has_key = attention_mask(mask, xq.shape[1])
        with torch.autocast(q.device.type, enabled=False):  # logits from coordinates: float32 even under bf16
            out = F.scaled_dot_product_attention(q, k, z.float().unsqueeze(1), attn_mask=attn_mask, scale=1.0)[:, 0]
        return (out if has_key is None else out * has_key.to(out.dtype)).to(z.dtype)  # None: no mask needed


def masked_centre(x: Tensor, mask: Tensor) -> Tensor:
    """Mean ``[B, 1, d]`` of the valid points of ``x [B, N, d]`` (0 for a task without any)."""
    return (x * mask.unsqueeze(-1)).sum(1, keepdim=True) / mask.sum(1).clamp(min=1).view(-1, 1, 1)
