"""Pipeline components, one concept per module, in the order data flows through them:

``embeddings`` -> ``encoders`` -> ``grid_encoders`` -> ``processors`` -> ``grid_decoders`` -> ``likelihoods``,
with ``attention`` (MHSA / MHCA blocks), ``grids`` (coordinates, index arithmetic) and ``tokens``
(the containers passed between stages). ``te_attention`` (translation-equivariant attention) and ``equivariant``
(TE-TNP, TE-PT-TNP, RCNP, TE k-NN decoder) and ``sparse_attention`` (MSA, TFS) add components to the same slots.
"""

from gridtnp.nn import (  # noqa: F401
    embeddings,
    encoders,
    equivariant,
    grid_decoders,
    grid_encoders,
    likelihoods,
    processors,
    sparse_attention,
)
