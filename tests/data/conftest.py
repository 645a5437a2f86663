"""Fixtures the data tests share: a small prepared ERA5 store and a station file, built once per module."""

import pytest

from tests.data.test_era5 import make_store, write_stations


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_store(tmp_path_factory.mktemp("era5"))


@pytest.fixture(scope="module")
def stations(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_stations(tmp_path_factory.mktemp("stations") / "stations.csv")
