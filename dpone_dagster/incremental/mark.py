"""Taking a run's mark so that no transaction in flight at that moment is lost.

The mark is the largest cursor value, read with an index probe inside one ``REPEATABLE READ
READ ONLY`` snapshot; in the same snapshot every other session of the source database with a
transaction open is listed (the core's evidence, :mod:`dpone_dagster.core.in_flight`: each
holds its virtual xid's lock from its first statement, whether it has written yet or not). A writer
among them may have taken its cursor value (``now()``, ``nextval``) before the mark and commit
after the run read that range. The run waits for them, at most ``settle_timeout`` seconds, and
reads its first batch only then, in a later snapshot that sees whatever they committed.

A session that stays open longer (an idle-in-transaction session, often unrelated) does not
stall the stream: the run goes ahead, names it in its notices with the stable code
``incremental_mark_unsettled``, and the stream keeps the bound it read from. Every later run
reads again from that bound (so rows such a transaction commits below the mark are copied by
the first run after it ends) until a mark is taken with none of them open. The cost is reading
that range again on every run meanwhile; ``idle_in_transaction_session_timeout`` on the source
bounds it.

The limit, stated: this holds for a cursor that a writer takes from the server while its
transaction is open (``now()``, ``clock_timestamp()``, a sequence without ``CACHE``). A cursor
set from a client clock that runs behind the server's, or a cached sequence, can land below a
mark in a transaction that began after it: the ``lookback`` option reads that much below the
mark again on every run.
"""

from __future__ import annotations

from psycopg import sql

from dpone_dagster.core.errors import RefusalColumn
from dpone_dagster.core.marks import Mark, mark_snapshot, settle_mark
from dpone_dagster.cursor.table_check import refuse_null_cursor
from dpone_dagster.postgres.connection import Connection

from .shape import StreamShape


def check_no_null_cursor(conn: Connection, shape: StreamShape) -> None:
    """Refuses a source with a NULL cursor (the one table check's index probe, under the
    stream's codes), before anything is written.

    Raises:
        EngineError: ``incremental_cursor_null``.
    """
    refuse_null_cursor(conn, shape, RefusalColumn.MOVING_MARK)


def take_mark(
    conn: Connection, shape: StreamShape, *, settle_timeout: float, poll_interval: float = 0.05
) -> Mark:
    """Reads the mark in one snapshot, then waits out the transactions in flight at that moment.

    Args:
        conn: An autocommit source session with the digest's settings pinned.
        shape: The stream.
        settle_timeout: Seconds to wait for the transactions in flight at the mark.
        poll_interval: Seconds between two looks at ``pg_locks``.

    A NULL cursor was refused when the run was planned (:func:`check_no_null_cursor`); one
    written since is below no mark, so no run copies it until the next plan refuses it.
    """
    with mark_snapshot(conn) as snapshot:
        found = conn.execute(
            sql.SQL("SELECT max({c})::text FROM {t}").format(
                c=shape.cursor.ident, t=shape.source.ident
            )
        ).fetchone()
    assert found is not None
    mark = None if found[0] is None else str(found[0])
    return settle_mark(
        conn, snapshot, mark, settle_timeout=settle_timeout, poll_interval=poll_interval
    )
