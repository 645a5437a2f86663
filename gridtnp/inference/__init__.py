"""Inference: a trained checkpoint's predictions as ``xarray.Dataset``, in the data's physical units, as CF.

* ``predict(module, context, targets)``: the Python API on a user's own xarray data (``predictions``).
* ``PredictionWriter``: the callback behind ``gridtnp predict`` (``predictions``).
* ``inputs``, ``cells``, ``climatology``, ``coverage``, ``cf``: the checks and conversions ``predict`` is made of.
"""

from __future__ import annotations

from gridtnp.inference import predictions
from gridtnp.inference.predictions import *  # noqa: F403

__all__ = list(predictions.__all__)
