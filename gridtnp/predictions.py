"""An alias of ``gridtnp.inference``, the home of ``predict`` and ``PredictionWriter``: names such as
``gridtnp.predictions.predict`` in notebooks and configs resolve here to the same objects."""

from __future__ import annotations

from gridtnp import inference
from gridtnp.inference import *  # noqa: F403

__all__ = list(inference.__all__)
