"""owned_staging_handle on a real PostgreSQL target: a failure before handover drops the table."""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Callable

import psycopg
import pytest
from dagster import DagsterExecutionInterruptedError
from psycopg import sql

from dpone_dagster.lifecycle import LifecycleError, owned_staging_handle
from dpone_dagster.postgres import TableName
from dpone_dagster.postgres.staging import PostgresStagingTable, staging_name_for
from tests.helpers import pg
from tests.helpers.proxy import TcpProxy

TARGET = TableName("sales", "Order Items")


@pytest.fixture
def target(target_dsn: str) -> str:
    pg.execute(target_dsn, "CREATE SCHEMA sales")
    pg.execute(target_dsn, 'CREATE TABLE sales."Order Items" (id bigint PRIMARY KEY, note text)')
    return target_dsn


def staging_for(
    conn: psycopg.Connection[tuple[object, ...]], dsn: str | None = None
) -> PostgresStagingTable:
    return PostgresStagingTable(conn, staging_name_for(TARGET), like=TARGET, dsn=dsn)


def staging_tables(dsn: str) -> list[str]:
    rows = pg.fetch_all(
        dsn,
        "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'sales' AND relname LIKE '\\_dpone\\_stg\\_%%'",
    )
    return [str(r[0]) for r in rows]


def test_ownership_passes_to_the_caller_when_materialize_returns(target: str) -> None:
    with psycopg.connect(target, autocommit=True) as conn:
        staging = staging_for(conn)

        def materialize() -> PostgresStagingTable:
            with owned_staging_handle(staging) as guard:
                conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 'a')").format(staging.name.ident))
                return guard.transfer(staging)

        owned = materialize()
    assert staging_tables(target) == [owned.name.name]
    assert pg.fetch_one(target, sql.SQL("SELECT count(*) FROM {}").format(owned.name.ident)) == 1


def insert_fails(
    conn: psycopg.Connection[tuple[object, ...]], staging: PostgresStagingTable
) -> None:
    conn.execute(sql.SQL("INSERT INTO {} VALUES ('not a number', 'x')").format(staging.name.ident))


def import_fails(
    conn: psycopg.Connection[tuple[object, ...]], staging: PostgresStagingTable
) -> None:
    with conn.cursor().copy(sql.SQL("COPY {} FROM STDIN").format(staging.name.ident)) as copy:
        copy.write(b"1\tfine\n2\tfine\nthree\tbroken\n")


def validation_fails(
    conn: psycopg.Connection[tuple[object, ...]], staging: PostgresStagingTable
) -> None:
    conn.execute(sql.SQL("INSERT INTO {} VALUES (1, NULL)").format(staging.name.ident))
    nulls = conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE note IS NULL").format(staging.name.ident)
    ).fetchone()
    if nulls and nulls[0]:
        raise ValueError("contract violated: note is required")


class ClosedStreamHandler(logging.Handler):
    """A log handler writing to a stream that has been closed: emitting raises."""

    def __init__(self) -> None:
        super().__init__()
        self.stream = io.StringIO()
        self.stream.close()

    def emit(self, record: logging.LogRecord) -> None:
        self.stream.write(self.format(record))


def logging_fails(
    conn: psycopg.Connection[tuple[object, ...]], staging: PostgresStagingTable
) -> None:
    logger = logging.getLogger("dpone.test.staging")
    logger.propagate = False
    handler = ClosedStreamHandler()
    logger.addHandler(handler)
    try:
        logger.warning("loaded %s", staging.display_name)
    finally:
        logger.removeHandler(handler)


def server_cancels(
    conn: psycopg.Connection[tuple[object, ...]], staging: PostgresStagingTable
) -> None:
    # The cancel is sent once pg_stat_activity shows the statement running (in its pg_sleep),
    # not after a guessed delay that a slow start could outlast.
    pid = conn.info.backend_pid
    errors: list[BaseException] = []

    def cancel_once_running() -> None:
        try:
            pg.wait_until(
                lambda: pg.fetch_all(
                    pg.admin_dsn(),
                    "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event = 'PgSleep'",
                    (pid,),
                ),
                timeout=30,
                what=f"backend {pid} runs its pg_sleep",
            )
            conn.cancel()
        except BaseException as exc:
            errors.append(exc)

    canceller = threading.Thread(target=cancel_once_running)
    canceller.start()
    try:
        conn.execute("SELECT pg_sleep(60)")  # ends early only by the cancel
    finally:
        canceller.join()
        if errors:
            raise errors[0]


def dagster_interrupts(
    conn: psycopg.Connection[tuple[object, ...]], staging: PostgresStagingTable
) -> None:
    conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 'a')").format(staging.name.ident))
    raise DagsterExecutionInterruptedError("run terminated from the UI")


def keyboard_interrupts(
    conn: psycopg.Connection[tuple[object, ...]], staging: PostgresStagingTable
) -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("step", "error"),
    [
        (insert_fails, psycopg.errors.InvalidTextRepresentation),
        (import_fails, psycopg.errors.InvalidTextRepresentation),
        (validation_fails, ValueError),
        (logging_fails, ValueError),
        (server_cancels, psycopg.errors.QueryCanceled),
        (dagster_interrupts, DagsterExecutionInterruptedError),
        (keyboard_interrupts, KeyboardInterrupt),
    ],
    ids=[
        "insert",
        "import",
        "contract",
        "logging",
        "cancellation",
        "dagster-interrupt",
        "keyboard",
    ],
)
@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "transaction"])
def test_every_failure_before_handover_drops_the_staging_table(
    target: str,
    step: Callable[..., None],
    error: type[BaseException],
    autocommit: bool,
) -> None:
    with psycopg.connect(target, autocommit=autocommit) as conn:
        staging = staging_for(conn)
        with pytest.raises(error) as raised, owned_staging_handle(staging) as guard:
            if not autocommit:
                conn.commit()  # the table now exists on its own: only a drop removes it
            assert staging_tables(target) == [staging.name.name]
            step(conn, staging)
            guard.transfer(staging)
        assert not getattr(raised.value, "__notes__", None), "the drop succeeded: no note"
    assert staging_tables(target) == []
    assert pg.fetch_one(target, 'SELECT count(*) FROM sales."Order Items"') == 0


def test_a_block_that_never_hands_over_drops_the_table(target: str) -> None:
    with psycopg.connect(target, autocommit=True) as conn:
        staging = staging_for(conn)
        with pytest.raises(LifecycleError) as err, owned_staging_handle(staging):
            pass
    assert err.value.code == "staging_not_transferred"
    assert staging_tables(target) == []


def test_a_failing_drop_is_a_redacted_note_on_the_primary_error(target: str) -> None:
    proxy = TcpProxy.to(target)
    secret_dsn = proxy.dsn(target).replace("user=postgres", "user=postgres password=s3cr3t-pw")
    assert "s3cr3t-pw" in secret_dsn
    try:
        with psycopg.connect(secret_dsn, autocommit=True) as conn:
            staging = staging_for(conn, dsn=secret_dsn)
            with (
                pytest.raises(RuntimeError, match="primary failure") as raised,
                owned_staging_handle(staging),
            ):
                # The target becomes unreachable: the session dies and no new one can open.
                proxy.refuse = True
                proxy.cut_all()
                raise RuntimeError("primary failure")
    finally:
        proxy.close()
    notes = "\n".join(getattr(raised.value, "__notes__", []))
    assert staging.display_name in notes
    assert "could not be dropped" in notes
    assert "s3cr3t-pw" not in notes
    assert "***" in notes
    # The table really is still there: the note is the operator's only lead.
    assert staging_tables(target) == [staging.name.name]
