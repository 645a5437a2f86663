"""Station observations beside a gridded store (``era5_observations``, registered on importing ``datamodule``).

* ``table``: the long format (one report a row) read and checked: ``read_observations(path) -> (table, problems)``.
* ``join``: reports on the store's hours: ``observations_to_hours(table, time, lat, lon, variables, tolerance)``.
* ``tasks``: ``ObservationTask`` (the station task's grid context, reports at the stations) and
  ``held_out_stations`` (the split by station identifier).
* ``datamodule``: ``ObservationDataModule`` and its ``observations:`` section ``ObservationConfig``.

The format and the rules: docs/data.md, "Station observations".
"""
