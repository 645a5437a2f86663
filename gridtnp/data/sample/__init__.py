"""Embedded default data shipped with gridtnp (provenance and licence in ``README.md`` next to this file)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

ERA5_SAMPLE = "era5_t2m_uk_2019-03.nc"
"""ERA5 hourly 2 m temperature, British Isles, March 2019: ``t2m [time=744, latitude=33, longitude=49]``."""

STATIONS_SAMPLE = "hadisd_stations_0p25.csv"
"""9,957 HadISD station locations snapped to the 0.25 degree grid (``latitude``, ``longitude``)."""

OBSERVATIONS_SAMPLE = "observations_t2m_uk_2019-03.csv.gz"
"""Synthetic station observations of t2m derived from the ERA5 sample (long format; ``make_observations.py``)."""


def sample_path(name: str = ERA5_SAMPLE) -> Path:
    """Filesystem path of an embedded sample file, e.g. ``sample_path("hadisd_stations_0p25.csv")``."""
    files = {ERA5_SAMPLE, STATIONS_SAMPLE, OBSERVATIONS_SAMPLE}
    if name not in files:
        from gridtnp.registry import ConfigError

        raise ConfigError(f"Unknown sample file {name!r}. Shipped samples: {', '.join(sorted(files))}.")
    # The package is installed as plain files (setuptools package data, no zip import), so the traversable
    # resource is a real path that stays valid after this call.
    return Path(str(resources.files(__name__).joinpath(name)))
