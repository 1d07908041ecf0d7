"""Strong locks taken politely: a swap or an ALTER waiting for a reader never stalls the target's
other readers, finishes once the reader lets go, and gives ``target_lock_timeout`` (naming the
reader, target untouched, no staging table left) when it never does."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from dpone_dagster.postgres import ConnectionOptions, ConnectionSettingsError, TableName
from dpone_dagster.postgres.connection import LOCK_WAIT_SETTING, connect
from dpone_dagster.postgres.lock_wait import LOCK_ATTEMPT_SECONDS, lock_wait_of, under_lock_wait
from dpone_dagster.snapshot_copy import CopyError, CopyOptions, CopyReport, copy_tables
from tests.helpers import locks, pg

MIXED = TableName("public", "mixed")
COPY_APP = "dpone-lock-copy"
HOLDER_APP = "dpone-test-holder"
READER_MARGIN = 1.0
"""Seconds a sampled reader may wait beyond one attempt's lock_timeout (scheduling, a loaded
machine shared with other suites)."""


def options(lock_wait: float) -> CopyOptions:
    return CopyOptions(
        target_options=ConnectionOptions(application_name=COPY_APP, lock_wait=lock_wait)
    )


@contextmanager
def reader_holding(dsn: str, table: TableName) -> Iterator[psycopg.Connection[object]]:
    """A session that read ``table`` in a transaction it keeps open (its ACCESS SHARE lock
    stays until it ends): what a dashboard's long transaction does."""
    conn: psycopg.Connection[object] = psycopg.connect(dsn, application_name=HOLDER_APP)
    try:
        conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table.ident)).fetchone()
        yield conn
    finally:
        conn.close()


class CopyThread:
    """A ``replace`` copy running in a thread; its report or its error."""

    def __init__(self, source_dsn: str, target_dsn: str, lock_wait: float, sink: str) -> None:
        self.report: CopyReport | None = None
        self.error: BaseException | None = None
        self.seconds = 0.0
        args = (source_dsn, target_dsn, lock_wait, sink)
        self._thread = threading.Thread(target=self._run, args=args, daemon=True)
        self._thread.start()

    def _run(self, source_dsn: str, target_dsn: str, lock_wait: float, sink: str) -> None:
        started = time.monotonic()
        try:
            self.report = copy_tables(
                source_dsn, target_dsn, ["public.mixed"], strategy="whole_copy", sink=sink,
                tuning=options(lock_wait),
            )  # fmt: skip
        except BaseException as exc:
            self.error = exc
        finally:
            self.seconds = time.monotonic() - started

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the copy did not end in {timeout}s"


def wait_until_the_copy_waits_for_the_lock(target_dsn: str) -> None:
    pg.wait_until(
        lambda: locks.lock_waiters(target_dsn, COPY_APP, wait_event="relation"),
        timeout=60,
        what="the copy waits for its lock on the target",
    )


def sample_readers(dsn: str, table: TableName, seconds: float) -> list[float]:
    """New readers, one after the other for ``seconds``: how long each ``SELECT`` took."""
    took: list[float] = []
    end = time.monotonic() + seconds
    statement = sql.SQL("SELECT count(*) FROM {}").format(table.ident)
    while time.monotonic() < end:
        with psycopg.connect(dsn, autocommit=True, application_name="dpone-test-reader") as conn:
            conn.execute("SET statement_timeout = '30s'")
            started = time.monotonic()
            conn.execute(statement).fetchone()
            took.append(time.monotonic() - started)
    return took


def seed(source_dsn: str, target_dsn: str) -> tuple[int, str]:
    pg.create_mixed_table(source_dsn, rows=300)
    copy_tables(source_dsn, target_dsn, ["public.mixed"], strategy="whole_copy")
    pg.execute(source_dsn, "INSERT INTO mixed (id, qty, label) SELECT g, 1, 'new' "
               "FROM generate_series(1001, 1100) g")  # fmt: skip
    return pg.table_fingerprint(target_dsn, "public", "mixed")


@pytest.mark.parametrize("sink", ["replace", "merge"])
def test_new_readers_are_never_queued_behind_a_waiting_swap_and_it_finishes_when_the_reader_lets_go(
    source_dsn: str, target_dsn: str, sink: str
) -> None:
    """``replace`` waits for its DROP/RENAME, ``merge`` for the ALTER of an added column."""
    seed(source_dsn, target_dsn)
    if sink == "merge":  # schema evolution: the target gains the source's new column
        pg.execute(source_dsn, "ALTER TABLE mixed ADD COLUMN extra text DEFAULT 'x'")
    with reader_holding(target_dsn, MIXED) as holder:
        copy = CopyThread(source_dsn, target_dsn, lock_wait=120, sink=sink)
        wait_until_the_copy_waits_for_the_lock(target_dsn)
        took = sample_readers(target_dsn, MIXED, seconds=4 * LOCK_ATTEMPT_SECONDS)
        assert copy.report is None and copy.error is None, "the copy did not wait for the reader"
        holder.commit()  # the reader lets go
        copy.join(60)
    assert copy.error is None, copy.error
    assert len(took) >= 5, took
    assert max(took) < LOCK_ATTEMPT_SECONDS + READER_MARGIN, took
    assert pg.table_fingerprint(target_dsn, "public", "mixed") == pg.table_fingerprint(
        source_dsn, "public", "mixed"
    )
    assert pg.staging_tables(target_dsn) == []


@pytest.mark.parametrize("sink", ["replace", "merge"])
def test_a_reader_that_never_lets_go_gives_target_lock_timeout_within_the_deadline(
    source_dsn: str, target_dsn: str, sink: str
) -> None:
    before = seed(source_dsn, target_dsn)
    if sink == "merge":
        pg.execute(source_dsn, "ALTER TABLE mixed ADD COLUMN extra text DEFAULT 'x'")
    columns_before = pg.fetch_all(
        target_dsn, "SELECT attname FROM pg_attribute WHERE attrelid = 'mixed'::regclass"
    )
    with reader_holding(target_dsn, MIXED) as holder:
        pid = holder.info.backend_pid
        copy = CopyThread(source_dsn, target_dsn, lock_wait=3, sink=sink)
        copy.join(60)
    assert isinstance(copy.error, CopyError), copy.error
    error = copy.error
    assert error.code == "target_lock_timeout", error
    assert 3 <= copy.seconds < 3 + LOCK_ATTEMPT_SECONDS + 5, copy.seconds
    assert f"pid {pid} " in error.message and HOLDER_APP in error.message, error.message
    assert "idle in transaction" in error.message, error.message
    assert any("pg_terminate_backend" in a for a in error.next_actions), error.next_actions
    assert any("lock_wait" in a for a in error.next_actions), error.next_actions
    assert pg.table_fingerprint(target_dsn, "public", "mixed") == before
    assert columns_before == pg.fetch_all(
        target_dsn, "SELECT attname FROM pg_attribute WHERE attrelid = 'mixed'::regclass"
    )
    assert pg.staging_tables(target_dsn) == []
    assert error.report is not None and error.report.outcome.value == "abort"


def test_the_lock_timeout_of_an_attempt_does_not_outlive_it(target_dsn: str) -> None:
    """After the statements, the transaction's later ones run under the session's own
    lock_timeout (a ledger write waiting for its advisory lock is not cut short), and the
    statements' effects are kept."""
    pg.execute(target_dsn, "CREATE TABLE mixed (id int)")
    with psycopg.connect(target_dsn, options="-c lock_timeout=7s") as conn:
        inside: list[object] = []

        def body() -> None:
            inside.append(conn.execute("SELECT current_setting('lock_timeout')").fetchone())
            conn.execute("ALTER TABLE mixed ADD COLUMN added int")

        under_lock_wait(conn, [MIXED], body, doing="test")
        after = conn.execute("SELECT current_setting('lock_timeout')").fetchone()
        conn.commit()
    assert inside == [("1s",)] and after == ("7s",)  # LOCK_ATTEMPT_SECONDS, as the server prints it
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM pg_attribute WHERE attname = 'added'"
                        " AND attrelid = 'mixed'::regclass") == 1  # fmt: skip


@pytest.mark.parametrize("bad", [0, -1, "soon", True])
def test_a_lock_wait_that_is_not_a_positive_number_is_refused(bad: object) -> None:
    with pytest.raises(ConnectionSettingsError) as caught:
        ConnectionOptions(lock_wait=bad)  # type: ignore[arg-type]
    assert caught.value.code == "connection_options_invalid"


@pytest.mark.parametrize(
    ("dsn_options", "lock_wait", "expected"),
    [
        (None, None, 300.0),  # the default
        (None, 7.5, 7.5),
        ("--dpone.lock_wait=5", 12.0, 12.0),  # the DSN's own spelling loses to the option's
        ("-c dpone.lock_wait=5 -c statement_timeout=0", None, 300.0),
    ],
)
def test_a_sessions_lock_wait_is_what_the_server_holds_whatever_the_dsn_said(
    target_dsn: str, dsn_options: str | None, lock_wait: float | None, expected: float
) -> None:
    """``lock_wait_of`` reads the deadline from the session's startup options and agrees with
    the server's setting, whatever the DSN's own options said."""
    dsn = target_dsn if dsn_options is None else make_conninfo(target_dsn, options=dsn_options)
    options = ConnectionOptions() if lock_wait is None else ConnectionOptions(lock_wait=lock_wait)
    with connect(dsn, options, side="target", autocommit=True) as conn:
        assert lock_wait_of(conn) == expected
        assert conn.execute(f"SHOW {LOCK_WAIT_SETTING}").fetchone() == (f"{expected:g}",)
