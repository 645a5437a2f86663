"""Pipeline components, one module (or package) per stage, in the order data flows through them:

``embeddings`` -> ``encoders`` -> ``grid_encoders`` -> ``processors`` -> ``grid_decoders`` -> ``likelihoods``
(and, optionally, ``residuals``: the mean as a context interpolation plus what the network predicts, and
``kriging``: the predictive conditioned on one source's departures by a closed-form GP layer).
Layers they share: ``attention`` (plain and translation-equivariant attention, the pre-norm blocks), ``grids``
(coordinates, index arithmetic, kernels), ``chunking`` (bounded-memory pairwise work), ``conditioning`` (GP
conditioning of departures: ``kriging``, ``mos_kriging`` and the residual's ``departures``) and ``tokens`` (the
containers passed between stages). Model families (TE-TNPs, MSA/TFS, ...) are presets over these stages
(``gridtnp.models.presets``), not modules of their own.
"""

from gridtnp.nn import (  # noqa: F401  (importing registers every component)
    embeddings,
    encoders,
    grid_decoders,
    grid_encoders,
    kriging,
    likelihoods,
    processors,
    residuals,
)
