"""Grid decoders: processor states + target tokens ``zt [B, Nt, D]`` at ``xt [B, Nt, Dx]`` -> ``[B, Nt, D]``.

Interface: ``decoder(states: list[Latent], zt, xt) -> [B, Nt, D]``. A decoder with ``layers = L`` reads the last
``L`` processor states, one block per state, so targets are refreshed after every processor layer as in the TNP
(eq. 9); ``layers = 1`` reads the final state. The model passes the processor's number of states as ``layers``.

* ``gridded``: ``knn``, ``te_knn``, ``kernel_interpolation`` (grid states).
* ``interpolation``: ``interpolation`` (the learned linear-interpolation baseline).
* ``mos``: ``mos``, ``mos_kriging`` (per-place regression on the gridded values, and kriging of its residuals).
* ``kernel_averaging``: ``gka`` (Gaussian kernel averaging, dense or over the k nearest).
* ``sets``: ``cross_attention``, ``concat``, ``te_cross_attention``, ``relational``, ``joint_self_attention``,
  ``transformer_decoder``.
"""

from gridtnp.nn.grid_decoders.gridded import (
    KernelInterpolationDecoder,
    KNNDecoder,
    NeighbourCrossAttentionBlock,
    TEKNNDecoder,
)
from gridtnp.nn.grid_decoders.interpolation import InterpolationDecoder
from gridtnp.nn.grid_decoders.kernel_averaging import GKADecoder
from gridtnp.nn.grid_decoders.mos import MOSDecoder, MOSKrigingDecoder
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
    "RelationalDecoder",
    "TECrossAttentionDecoder",
    "TEKNNDecoder",
    "TransformerDecoder",
]
