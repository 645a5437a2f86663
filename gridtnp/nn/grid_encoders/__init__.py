"""Grid encoders: per-source tokens at arbitrary locations -> pseudo-tokens (``Latent``).

Input: ``{source: Tokens(x [B, N_s, Dx], z [B, N_s, D_in], mask [B, N_s])}``. Output: a ``Latent``,
either on a regular grid ``[B, M1, ..., Md, D]`` or, for grid-free models, the set itself.

Sources: every encoder here except ``multi`` takes the union of all sources' tokens (``concat_sources``) and
encodes it onto one grid ("single" merging). ``multi`` encodes each source onto its own grid with its own inner
encoder and merges the grids.

Coarsening: the gridded encoders accept ``coarsen`` (an integer or one per dimension) and then encode straight
onto ``coarsen_grid(grid, coarsen)`` (block centres, ``M_d / coarsen_d`` points). The output ``Latent`` carries
that coarse grid, so the processor and decoder must be built for it.

Modules, one encoder each: ``identity``, ``pseudo_token``, ``average``, ``kernel_interpolation``, ``multi``,
``patch``; each registers itself where it is defined.
"""

from gridtnp.nn.grid_encoders.average import AverageGridEncoder
from gridtnp.nn.grid_encoders.identity import IdentityGridEncoder
from gridtnp.nn.grid_encoders.kernel_interpolation import KernelInterpolationEncoder
from gridtnp.nn.grid_encoders.multi import MultiSourceGridEncoder
from gridtnp.nn.grid_encoders.patch import PatchGridEncoder
from gridtnp.nn.grid_encoders.pseudo_token import PseudoTokenGridEncoder

__all__ = [
    "AverageGridEncoder",
    "IdentityGridEncoder",
    "KernelInterpolationEncoder",
    "MultiSourceGridEncoder",
    "PatchGridEncoder",
    "PseudoTokenGridEncoder",
]
