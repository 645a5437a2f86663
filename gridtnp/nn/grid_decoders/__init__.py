"""Grid decoders: processor states + target tokens ``zt [B, Nt, D]`` at ``xt [B, Nt, Dx]`` -> ``[B, Nt, D]``.

Interface: ``decoder(states: list[Latent], zt, xt) -> [B, Nt, D]``. A decoder with ``layers = L`` reads the last
``L`` processor states, one block per state, so targets are refreshed after every processor layer as in the TNP
(eq. 9); ``layers = 1`` reads the final state. The model passes the processor's number of states as ``layers``.

Modules: ``gridded`` (decoders of grid states), ``sets`` (of set states), ``interpolation`` and
``kernel_averaging`` (the classical baselines), ``mos`` (per-place regression on the gridded values),
``persistence`` (each target's last known value). Each
decoder registers itself where it is defined; ``gridtnp list grid_decoder`` names them (``... NAME``: its class and
module).
"""

from gridtnp.nn.grid_decoders.gridded import KernelInterpolationDecoder
from gridtnp.nn.grid_decoders.interpolation import InterpolationDecoder
from gridtnp.nn.grid_decoders.kernel_averaging import GKADecoder
from gridtnp.nn.grid_decoders.knn import KNNDecoder, NeighbourCrossAttentionBlock, TEKNNDecoder
from gridtnp.nn.grid_decoders.mos import MOSDecoder, MOSKrigingDecoder
from gridtnp.nn.grid_decoders.persistence import PersistenceDecoder
from gridtnp.nn.grid_decoders.sets import (
    ConcatDecoder,
    CrossAttentionDecoder,
    JointSelfAttentionDecoder,
    RelationalDecoder,
    TECrossAttentionDecoder,
    TransformerDecoder,
)

__all__ = [
    "ConcatDecoder",
    "CrossAttentionDecoder",
    "GKADecoder",
    "InterpolationDecoder",
    "JointSelfAttentionDecoder",
    "KNNDecoder",
    "KernelInterpolationDecoder",
    "MOSDecoder",
    "MOSKrigingDecoder",
    "NeighbourCrossAttentionBlock",
    "PersistenceDecoder",
    "RelationalDecoder",
    "TECrossAttentionDecoder",
    "TEKNNDecoder",
    "TransformerDecoder",
]
