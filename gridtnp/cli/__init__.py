"""The ``gridtnp`` command line: ``fit | validate | test | predict``, ``list``, ``data prepare``, ``plot``.

* ``main``: the entry point (``gridtnp ...`` or ``python -m gridtnp.cli ...``); ``GridTNPCLI``: the LightningCLI.
* ``guards``: user mistakes caught before anything runs, each turned into one line.
* ``reports``: what the commands print and log (the metric table, progress lines, filtered third-party messages).
"""

from gridtnp.cli.main import GridTNPCLI, main

__all__ = ["GridTNPCLI", "main"]
