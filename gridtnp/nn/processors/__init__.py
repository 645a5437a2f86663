"""Processors: update the pseudo-tokens and return one state per layer.

Interface: ``processor(latent: Latent) -> list[Latent]`` with ``num_states`` entries, each of the same layout as the
output (a grid ``[B, M1..Md, D]`` or a set ``[B, N, D]`` with its mask and, for TE models, locations), so that a
TNP-style decoder can refresh the targets after every layer (TNP eq. 9); decoders that read only the final state
use the last entry.

Modules: ``sets`` (processors of token sets, TE ones included), ``convolutional`` (ConvCNP), ``grid_transformers``
(gridded TNPs), ``mixers`` (HyperMixer token mixing). Each processor registers itself where it is defined;
``gridtnp list processor`` names them (``... NAME``: its class and module).
"""

from gridtnp.nn.processors.convolutional import CNNProcessor, GridConv, GridConvTranspose, UNetProcessor
from gridtnp.nn.processors.grid_transformers import SwinProcessor, ViTProcessor
from gridtnp.nn.processors.mixers import HyperMixerBlock, HyperMixerProcessor, HyperMixing
from gridtnp.nn.processors.sets import (
    IdentityProcessor,
    InducedSetProcessor,
    MeanProcessor,
    PerceiverProcessor,
    TEPerceiverProcessor,
    TETransformerProcessor,
    TransformerProcessor,
)

__all__ = [
    "CNNProcessor",
    "GridConv",
    "GridConvTranspose",
    "HyperMixerBlock",
    "HyperMixerProcessor",
    "HyperMixing",
    "IdentityProcessor",
    "InducedSetProcessor",
    "MeanProcessor",
    "PerceiverProcessor",
    "SwinProcessor",
    "TEPerceiverProcessor",
    "TETransformerProcessor",
    "TransformerProcessor",
    "UNetProcessor",
    "ViTProcessor",
]
