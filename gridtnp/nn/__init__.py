"""Pipeline components, one concept per module, in the order data flows through them:

``embeddings`` -> ``encoders`` -> ``grid_encoders`` -> ``processors`` -> ``grid_decoders`` -> ``likelihoods``,
with ``attention`` (MHSA / MHCA blocks), ``grids`` (coordinates, index arithmetic) and ``tokens``
(the containers passed between stages).
"""

from gridtnp.nn import embeddings, encoders, grid_decoders, grid_encoders, likelihoods, processors  # noqa: F401
