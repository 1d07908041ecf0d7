"""How an engine's run ends on a failure (``core.sessions.fail_run``, the replication and
incremental engines' one run guard), against a real server: a database error is raised as its
coded error, chained to it, any other failure as itself, and either way no session is left
inside a transaction."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import pq

from dpone_dagster.core.sessions import Sessions, fail_run
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres import TableName

IDLE = pq.TransactionStatus.IDLE


def _sessions(source_dsn: str, target_dsn: str) -> Sessions:
    """Two sessions, each inside a transaction (psycopg begins one at the first statement)."""
    source, target = psycopg.connect(source_dsn), psycopg.connect(target_dsn)
    source.execute("SELECT 1")
    target.execute("SELECT 1")
    return Sessions(source=source, target=target, ledger=target)


def test_a_database_error_ends_the_run_as_its_coded_error_with_every_session_rolled_back(
    source_dsn: str, target_dsn: str
) -> None:
    sessions = _sessions(source_dsn, target_dsn)
    table = TableName("public", "orders")
    try:
        with pytest.raises(DponeError) as raised:
            try:
                # A real cancel by the server: the target's transaction is aborted by it.
                sessions.target.execute("SET LOCAL statement_timeout = 1")
                sessions.target.execute("SELECT pg_sleep(5)")
            except BaseException as exc:
                fail_run(sessions, exc, "incremental_failed", sources=[table], targets=[table])
        assert raised.value.code == "target_query_canceled"
        assert isinstance(raised.value.__cause__, psycopg.errors.QueryCanceled)
        assert sessions.source.info.transaction_status is IDLE
        assert sessions.target.info.transaction_status is IDLE
    finally:
        sessions.close()


def test_any_other_failure_ends_the_run_as_itself_with_every_session_rolled_back(
    source_dsn: str, target_dsn: str
) -> None:
    sessions = _sessions(source_dsn, target_dsn)
    failure = KeyboardInterrupt()
    try:
        with pytest.raises(KeyboardInterrupt) as raised:
            try:
                raise failure
            except BaseException as exc:
                fail_run(sessions, exc, "replication_failed")
        assert raised.value is failure
        assert raised.value.__cause__ is None
        assert sessions.source.info.transaction_status is IDLE
        assert sessions.target.info.transaction_status is IDLE
    finally:
        sessions.close()
