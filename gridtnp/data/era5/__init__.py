"""The ERA5 task DataModules; importing this package registers them (``era5_stations``, ``era5_multisource``).

Both derive from ``gridtnp.data.store_datamodule.StoreDataModule`` (a prepared store or the embedded sample).

* ``station_reanalysis``: ``StationReanalysisDataModule``, station + reanalysis tasks; ``station_tasks``: its sampler;
  ``blocks``: the per-task block layouts of its coarse context.
* ``multisource``: ``MultiSourceDataModule``, multi-source spatio-temporal tasks, ``Source`` and its sampler.
* ``to_xarray``: their ``gridtnp predict`` outputs as CF ``xarray.Dataset``s in physical units.

Both read a prepared Zarr store (``gridtnp data prepare``; see ``gridtnp.data.store``) lazily, one time chunk at a
time, and are imported on first use (``gridtnp.data.StationReanalysisDataModule``, the registry) so that
``import gridtnp`` does not load xarray.
"""

from gridtnp.data.era5 import multisource, station_reanalysis  # noqa: F401  (importing registers the DataModules)
