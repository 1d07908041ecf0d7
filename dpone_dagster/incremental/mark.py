"""Taking a run's mark so that no transaction in flight at that moment is lost.

The mark is the largest cursor value, read with an index probe inside one ``REPEATABLE READ
READ ONLY`` snapshot; in the same snapshot every other session of the source database with a
transaction open is listed (the backfill's evidence, :func:`in_flight_transactions`: each holds
its virtual xid's lock from its first statement, whether it has written yet or not). A writer
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

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import IsolationLevel, sql

from dpone_dagster.backfill.boundary import in_flight_transactions, still_running
from dpone_dagster.backfill.sessions import transaction
from dpone_dagster.backfill.waits import wait_while
from dpone_dagster.lifecycle import token_digest

from .errors import incremental_error
from .shape import StreamShape

Conn = psycopg.Connection[tuple[object, ...]]


@dataclass(frozen=True)
class StreamMark:
    """A run's mark and its evidence.

    Attributes:
        mark: The largest cursor value at the mark's snapshot (``None``: an empty table).
        taken_at: The source server's clock when the snapshot was taken.
        snapshot_token_digest: Digest of the snapshot (``pg_current_snapshot()``).
        awaited: Transactions open at the mark that the run waited for.
        waited_seconds: How long it waited.
        unsettled: Virtual xids of those still open after the settle timeout.
        unsettled_pids: Their server backends.
    """

    mark: str | None
    taken_at: datetime
    snapshot_token_digest: str
    awaited: int
    waited_seconds: float
    unsettled: tuple[str, ...] = ()
    unsettled_pids: tuple[int, ...] = ()


def check_no_null_cursor(conn: Conn, shape: StreamShape) -> None:
    """Refuses a source with a NULL cursor (an index probe), before anything is written.

    Raises:
        IncrementalError: ``incremental_cursor_null``.
    """
    found = conn.execute(
        sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE {} IS NULL)").format(
            shape.source.ident, shape.cursor.ident
        )
    ).fetchone()
    if found is not None and found[0]:
        raise incremental_error("incremental_cursor_null", f"Table {shape.source}.")


class _StillOpenError(Exception):
    def __init__(self, running: Sequence[tuple[object, ...]]) -> None:
        super().__init__("still open")
        self.running = list(running)


def take_mark(
    conn: Conn, shape: StreamShape, *, settle_timeout: float, poll_interval: float = 0.05
) -> StreamMark:
    """Reads the mark in one snapshot, then waits out the transactions in flight at that moment.

    Args:
        conn: An autocommit source session with the digest's settings pinned.
        shape: The stream.
        settle_timeout: Seconds to wait for the transactions in flight at the mark.
        poll_interval: Seconds between two looks at ``pg_locks``.

    A NULL cursor was refused when the run was planned (:func:`check_no_null_cursor`); one
    written since is below no mark, so no run copies it until the next plan refuses it.
    """
    cursor, table = shape.cursor.ident, shape.source.ident
    with transaction(conn, IsolationLevel.REPEATABLE_READ, read_only=True):
        snap = conn.execute("SELECT pg_current_snapshot()::text, clock_timestamp()").fetchone()
        found = conn.execute(
            sql.SQL("SELECT max({c})::text FROM {t}").format(c=cursor, t=table)
        ).fetchone()
        in_flight = in_flight_transactions(conn)
    assert snap is not None
    assert found is not None
    running: list[tuple[object, ...]] = []
    waited = 0.0
    if in_flight:
        try:
            waited = wait_while(
                lambda: still_running(conn, in_flight),
                timeout=settle_timeout,
                interval=poll_interval,
                timed_out=_StillOpenError,
            )
        except _StillOpenError as open_:
            running, waited = open_.running, settle_timeout
    return StreamMark(
        mark=None if found[0] is None else str(found[0]),
        taken_at=snap[1],  # type: ignore[arg-type]
        snapshot_token_digest=token_digest(str(snap[0])),
        awaited=len(in_flight),
        waited_seconds=waited,
        unsettled=tuple(str(r[0]) for r in running),
        unsettled_pids=tuple(int(r[1]) for r in running),  # type: ignore[call-overload]
    )
