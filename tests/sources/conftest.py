"""Fixtures for the generic sources: fresh MariaDB databases (a real server, never a mock); the
Kafka broker's fixtures are in ``tests/conftest.py`` (the metadata test uses them too)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dpone_dagster.sources import MySQLSettings
from tests.helpers import mysql


@pytest.fixture(scope="session")
def mariadb_server() -> None:
    """Stops the whole run at once, saying how to start MariaDB, when it does not answer."""
    problem = mysql.server_problem()
    if problem is not None:
        pytest.exit(problem, returncode=3)


@pytest.fixture
def mysql_db(mariadb_server: None) -> Iterator[MySQLSettings]:
    """A fresh, empty MariaDB database, dropped when the test ends."""
    settings = mysql.create_database()
    yield settings
    mysql.drop_database(settings)
