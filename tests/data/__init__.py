"""Tests of gridtnp.data: synthetic tasks, prepared stores and the ERA5 DataModules."""
