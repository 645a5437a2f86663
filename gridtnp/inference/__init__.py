"""Inference: a trained checkpoint's predictions as ``xarray.Dataset``, in the data's physical units, as CF.

* ``predict(module, context, targets)``: the Python API on a user's own xarray data (``predictions``).
* ``PredictionWriter``: the callback behind ``gridtnp predict`` (``predictions``).
* ``inputs``, ``cells``, ``climatology``, ``coverage``, ``cf``: the checks and conversions ``predict`` is made of.
"""

from __future__ import annotations

from gridtnp.inference.predictions import (
    RAW_UNITS,
    UNITLESS,
    PredictionWriter,
    checkpoint_statistics,
    departures_from_reference,
    geographic_inputs,
    is_prediction_file,
    longitude_centre,
    predict,
    raw_predictions,
    write_dataset,
)

__all__ = [
    "RAW_UNITS",
    "UNITLESS",
    "PredictionWriter",
    "checkpoint_statistics",
    "departures_from_reference",
    "geographic_inputs",
    "is_prediction_file",
    "longitude_centre",
    "predict",
    "raw_predictions",
    "write_dataset",
]
