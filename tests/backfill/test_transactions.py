"""Every backfill transaction is psycopg's, checked with the server rather than assumed.

psycopg's ``BEGIN`` carries the session's isolation level and read-only mode; a nested block is
a savepoint whose rollback leaves the outer transaction going; an interrupt ends the
transaction; and the settings a session pinned when it was opened survive every rollback.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg import IsolationLevel, pq

from dpone_dagster.backfill import BackfillOptions
from dpone_dagster.core import LedgerConfig
from dpone_dagster.core.sessions import Sessions, prepared_session, transaction
from dpone_dagster.postgres.connection import ConnectionOptions
from tests.backfill.conftest import Pair, copy_rows
from tests.helpers import pg

APP = "dpone-backfill"
# A session default other than the pinned one: seeing UTC proves the session's own pin holds.
OPTIONS = ConnectionOptions(application_name=APP, extra={"options": "-c TimeZone=Asia/Tokyo"})
SNAPSHOT = ("repeatable read", "on", "UTC")
READ_WRITE = ("read committed", "off", "UTC")

Conn = psycopg.Connection[tuple[object, ...]]


class Interrupted(BaseException):
    """Stands in for Dagster's DagsterExecutionInterruptedError (also a BaseException)."""


def modes(conn: Conn) -> tuple[object, ...]:
    """The isolation level, read-only mode and time zone of ``conn``'s current transaction."""
    row = conn.execute(
        "SELECT current_setting('transaction_isolation'),"
        " current_setting('transaction_read_only'), current_setting('TimeZone')"
    ).fetchone()
    assert row is not None
    return tuple(row)


def state(pid: int) -> object:
    """How the server sees backend ``pid``: ``idle``, ``idle in transaction``..."""
    return pg.fetch_one(pg.admin_dsn(), "SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,))


def session(dsn: str) -> Conn:
    """A session opened as the backfill opens its own (autocommit, prepared, pinned)."""
    conn = prepared_session(dsn, OPTIONS, "target")
    conn.prepare_threshold = 0
    return conn


@pytest.mark.parametrize(
    ("isolation", "read_only", "expected"),
    [
        (IsolationLevel.REPEATABLE_READ, True, SNAPSHOT),
        (IsolationLevel.READ_COMMITTED, False, READ_WRITE),
    ],
    ids=["snapshot", "read-write"],
)
def test_a_transaction_begins_with_the_isolation_and_mode_it_asks_for(
    target_dsn: str, isolation: IsolationLevel, read_only: bool, expected: tuple[str, ...]
) -> None:
    with session(target_dsn) as conn:
        pid = conn.info.backend_pid
        assert state(pid) == "idle"
        with transaction(conn, isolation, read_only=read_only):
            assert modes(conn) == expected
            assert state(pid) == "idle in transaction"
        assert conn.info.transaction_status is pq.TransactionStatus.IDLE
        assert state(pid) == "idle"


def test_a_savepoint_rolls_back_alone_and_an_interrupt_ends_the_transaction(
    target_dsn: str,
) -> None:
    pg.execute(target_dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    with session(target_dsn) as conn:
        with transaction(conn, IsolationLevel.READ_COMMITTED, read_only=False):
            conn.execute("INSERT INTO t VALUES (1)")
            with (
                pytest.raises(psycopg.errors.UniqueViolation),
                conn.transaction(savepoint_name="dpone_batch"),
            ):
                conn.execute("INSERT INTO t VALUES (2)")
                conn.execute("INSERT INTO t VALUES (1)")
            assert modes(conn) == READ_WRITE  # still inside the outer transaction
            conn.execute("INSERT INTO t VALUES (3)")
        assert pg.fetch_all(target_dsn, "SELECT id FROM t ORDER BY id") == [(1,), (3,)]
        with (
            pytest.raises(Interrupted),
            transaction(conn, IsolationLevel.READ_COMMITTED, read_only=False),
        ):
            conn.execute("INSERT INTO t VALUES (4)")
            raise Interrupted
        assert pg.open_transactions(target_dsn, APP) == []
        assert pg.fetch_all(target_dsn, "SELECT id FROM t ORDER BY id") == [(1,), (3,)]
        assert modes(conn)[2] == "UTC"  # the session's pin survived both rollbacks


def test_abandon_rolls_back_an_open_transaction_and_closes_a_session_busy_with_a_copy(
    source_dsn: str, target_dsn: str
) -> None:
    pg.execute(target_dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    with session(source_dsn) as src, session(target_dsn) as tgt:
        tgt.autocommit = False  # a transaction a failed step left open
        tgt.execute("INSERT INTO t VALUES (1)")
        with src.cursor().copy("COPY (SELECT generate_series(1, 1000000)) TO STDOUT") as copy:
            copy.read()  # mid-COPY: this session cannot take a ROLLBACK
            Sessions(src, tgt, tgt).abandon()
        assert src.closed
        assert not tgt.closed and tgt.info.transaction_status is pq.TransactionStatus.IDLE
    assert pg.fetch_all(target_dsn, "SELECT id FROM t") == []


@pytest.mark.parametrize("ledger_elsewhere", [False, True], ids=["ledger-in-target", "elsewhere"])
def test_each_batch_session_is_in_a_psycopg_transaction_of_its_mode(
    pair: Pair, make_database: object, ledger_elsewhere: bool
) -> None:
    ledger = LedgerConfig(dsn=make_database("dpone_ledger")) if ledger_elsewhere else None  # type: ignore[operator]
    # An equal row already in batch 2's range: its direct COPY fails on the unique key, only
    # the savepoint is rolled back, and the same snapshot goes through the staged apply.
    copy_rows(pair.source, pair.target, "SELECT * FROM mixed WHERE id = 1500")
    b = pair.backfill(BackfillOptions(batch_size=1000), ledger=ledger, connection_options=OPTIONS)
    seen: list[dict[str, object]] = []

    def on_phase(phase: str) -> None:
        if phase in ("copy", "commit"):
            sessions = b._sessions  # the sessions under test, inside the batch
            assert sessions is not None
            seen.append(
                {
                    "phase": phase,
                    "source": state(sessions.source.info.backend_pid),
                    "target": state(sessions.target.info.backend_pid),
                    "ledger": state(sessions.ledger.info.backend_pid),
                    "modes": [
                        modes(c) for c in (sessions.source, sessions.target, sessions.ledger)
                    ],
                }
            )

    b.on_phase = on_phase
    result = b.run()
    assert [r.observation.apply_path.value for r in b.receipts()] == [
        "direct_copy", "staged_apply", "direct_copy", "direct_copy", "direct_copy",
    ]  # fmt: skip
    assert (result.run.progress.copied_count, result.run.progress.duplicate_count) == (4999, 1)
    assert [step["phase"] for step in seen] == ["copy", "commit"] * 5
    for step in seen:
        assert step["target"] == step["ledger"] == "idle in transaction", step
        if step["phase"] == "copy":  # the batch's snapshot is open on the source
            assert step["source"] == "idle in transaction", step
            assert step["modes"] == [SNAPSHOT, READ_WRITE, READ_WRITE], step
        else:  # rows and receipt are about to commit; the source's read has ended
            assert step["source"] == "idle", step
            assert step["modes"][1:] == [READ_WRITE, READ_WRITE], step
    assert pg.open_transactions(pair.source, APP) == []
    assert pg.open_transactions(pair.target, APP) == []
    assert pair.fingerprints()[0] == pair.fingerprints()[1]
