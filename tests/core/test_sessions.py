"""How an engine's run ends on a failure (``core.sessions.fail_run``, the replication and
incremental engines' one run guard), against a real server: a database error is raised as its
coded error, chained to it, any other failure as itself, and either way no session is left
inside a transaction. And how a run's sessions open (``core.sessions.open_at_once``): at once,
and a start that fails leaves none of the others open."""

from __future__ import annotations

import socket
import uuid
from functools import partial

import psycopg
import pytest
from psycopg import pq

from dpone_dagster.core.sessions import Sessions, fail_run, open_at_once, prepared_session
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres import TableName
from dpone_dagster.postgres.connection import ConnectionOptions
from dpone_dagster.reconcile.digest import DIGEST_SETTINGS
from tests.helpers import pg

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


def _sessions_named(dsn: str, name: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_sessions_open_at_once_prepared_in_order_and_idle(source_dsn: str, target_dsn: str) -> None:
    """Each session starts with the digest's settings (in its startup packet), over the
    database's defaults and the DSN's own options, and idle."""
    options = ConnectionOptions(application_name=f"dpone-open-{uuid.uuid4().hex[:8]}")
    name = psycopg.conninfo.conninfo_to_dict(source_dsn)["dbname"]
    pg.execute(source_dsn, f'ALTER DATABASE "{name}" SET "TimeZone" = \'Asia/Tokyo\'')
    pg.execute(source_dsn, f"ALTER DATABASE \"{name}\" SET bytea_output = 'escape'")
    contrary = psycopg.conninfo.make_conninfo(
        source_dsn, options="-c DateStyle=German -c extra_float_digits=0 -c lc_monetary=POSIX"
    )
    src, tgt = open_at_once(
        partial(prepared_session, contrary, options, "source"),
        partial(prepared_session, target_dsn, options, "target", autocommit=False),
    )
    try:
        assert (src.info.dbname, tgt.info.dbname) == (
            psycopg.conninfo.conninfo_to_dict(source_dsn)["dbname"],
            psycopg.conninfo.conninfo_to_dict(target_dsn)["dbname"],
        )
        assert src.autocommit and not tgt.autocommit
        # Prepared (the digest's pinned settings) and, without autocommit, committed: idle.
        assert tgt.info.transaction_status is IDLE
        for conn in (src, tgt):
            for setting, value in DIGEST_SETTINGS:
                assert conn.execute(f"SHOW {setting}").fetchone() == (value,), setting
        assert src.execute("SELECT '2026-01-02 03:04:05+00'::timestamptz::text").fetchone() == (
            "2026-01-02 03:04:05+00",
        )
        assert _sessions_named(source_dsn, options.application_name) == 2
    finally:
        src.close()
        tgt.close()


def test_a_session_that_cannot_start_closes_the_ones_that_did(source_dsn: str) -> None:
    options = ConnectionOptions(application_name=f"dpone-open-{uuid.uuid4().hex[:8]}")
    with socket.socket() as free:  # a port nothing listens on: a real refused connection
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    nowhere = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    with pytest.raises(DponeError) as raised:
        open_at_once(
            partial(prepared_session, source_dsn, options, "source"),
            partial(prepared_session, nowhere, options, "target"),
            partial(prepared_session, source_dsn, options, "source"),
        )
    assert raised.value.code == "target_unreachable"
    # The traceback still holds the opened connections: only a close ends their backends
    # (which leave pg_stat_activity a moment after the client's goodbye).
    pg.wait_until(
        lambda: _sessions_named(source_dsn, options.application_name) == 0,
        timeout=10, what="the sessions that did start are closed",
    )  # fmt: skip
