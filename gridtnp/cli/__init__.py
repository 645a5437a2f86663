"""The ``gridtnp`` command line: ``fit | validate | test | predict``, ``list``, ``data prepare``, ``plot``.

* ``main``: the entry point (``gridtnp ...`` or ``python -m gridtnp.cli ...``); ``lightning``: ``GridTNPCLI``, the
  LightningCLI behind ``fit | validate | test | predict``; ``evaluate``: ``gridtnp plot`` and ``gridtnp report``.
* ``guards``: user mistakes caught before anything runs, each turned into one line.
* ``reports``: what the commands print and log (the metric table, progress lines, filtered third-party messages).
"""

from typing import Any

from gridtnp.cli.main import main

__all__ = ["GridTNPCLI", "main"]


def __getattr__(name: str) -> Any:
    if name == "GridTNPCLI":  # Lightning loads with it, not with `gridtnp data` or `gridtnp --help`
        from gridtnp.cli.lightning import GridTNPCLI

        return GridTNPCLI
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
