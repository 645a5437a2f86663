"""An alias of ``gridtnp.inference``, the home of ``predict`` and ``PredictionWriter``: names such as
``gridtnp.predictions.predict`` in notebooks and configs resolve here to the same objects."""

from __future__ import annotations

from gridtnp.inference import (
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
