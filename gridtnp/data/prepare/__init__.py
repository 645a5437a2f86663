"""The writing side: ``gridtnp data prepare`` turns NetCDF / GRIB / Zarr inputs into one Zarr store in gridtnp's
layout, with statistics (the readers in ``gridtnp.data`` never import this package).

* ``pipeline``: ``prepare(inputs, out, ...)``, the whole conversion; ``command``: ``data_main(argv)``, its CLI.
* ``inputs``, ``input_checks``: opening, cutting and checking the inputs; ``output_store``: the store around the
  data; ``writer``: block by block, bounded memory, resumable; ``append``: later steps added to a store.
"""

from gridtnp.data.prepare.command import data_main
from gridtnp.data.prepare.pipeline import prepare

__all__ = ["data_main", "prepare"]
