"""The real-PostgreSQL test harness.

The server comes from ``DPONE_TEST_PG_DSN`` (default ``postgresql://postgres@127.0.0.1:5432/
postgres``); its user must be allowed to ``CREATE DATABASE``. Every test that touches data gets
fresh databases and drops them afterwards. If the server does not answer, the whole run stops at
once with a message that says how to start one: no test ever skips for a missing server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.helpers import pg


def pytest_sessionstart(session: pytest.Session) -> None:
    problem = pg.server_problem(pg.admin_dsn())
    if problem is not None:
        pytest.exit(problem, returncode=3)


@pytest.fixture
def make_database() -> Iterator[Callable[[str], str]]:
    """A factory of fresh databases (DSNs), all dropped when the test ends."""
    made: list[str] = []

    def make(prefix: str = "dpone_t") -> str:
        dsn = pg.create_database(prefix)
        made.append(dsn)
        return dsn

    yield make
    for dsn in made:
        pg.drop_database(dsn)


@pytest.fixture
def source_dsn(make_database: Callable[[str], str]) -> str:
    """A fresh, empty source database."""
    return make_database("dpone_src")


@pytest.fixture
def target_dsn(make_database: Callable[[str], str]) -> str:
    """A fresh, empty target database."""
    return make_database("dpone_tgt")
