"""Taking a mark: the largest cursor value, read in one snapshot, with the transactions in flight
at that moment waited out.

Both mark policies (:mod:`.mark_policies`) read a mark the same way, :func:`read_mark`.
:func:`mark_snapshot` opens a ``REPEATABLE READ READ
ONLY`` transaction, reads its snapshot token and the server's clock, lets the engine read its
mark (and whatever else it counts) inside it, and lists the transactions in flight in that same
snapshot (:mod:`.in_flight`). :func:`settle_mark` then waits them out, after the snapshot's
transaction has ended, so that the engine's first read of the range (in a later snapshot) sees
every row they commit below the mark. What an engine does with a transaction still open when
the wait runs out is its policy's rule: the fixed mark refuses to start, the moving mark goes
ahead and reads the range again on later runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

from psycopg import IsolationLevel, sql

from dpone_dagster.core.in_flight import in_flight_transactions, wait_out
from dpone_dagster.core.sessions import transaction
from dpone_dagster.lifecycle import token_digest
from dpone_dagster.postgres.connection import Connection

from .table_check import CursorTables, TableCheck


@dataclass
class MarkSnapshot:
    """The snapshot a mark is read in: its token and clock, and who was in flight then."""

    token: str
    taken_at: datetime
    in_flight: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Mark:
    """A mark and its evidence.

    Attributes:
        mark: The largest cursor value at the mark's snapshot (``None``: no row).
        taken_at: The source server's clock when the snapshot was taken.
        snapshot_token_digest: Digest of the snapshot (``pg_current_snapshot()``).
        awaited: Transactions open at the mark that were waited for.
        waited_seconds: How long that took.
        unsettled: Virtual xids of those still open when the wait ran out.
        unsettled_pids: Their server backends.
    """

    mark: str | None
    taken_at: datetime
    snapshot_token_digest: str
    awaited: int
    waited_seconds: float
    unsettled: tuple[str, ...] = ()
    unsettled_pids: tuple[int, ...] = ()


@contextmanager
def mark_snapshot(conn: Connection) -> Iterator[MarkSnapshot]:
    """A ``REPEATABLE READ READ ONLY`` transaction to read a mark in; once the block's reads are
    done, the transactions in flight in the same snapshot are listed and it commits.

    Args:
        conn: An autocommit source session, outside any transaction.

    Yields:
        The snapshot's token and clock; its ``in_flight`` is filled when the block ends.
    """
    with transaction(conn, IsolationLevel.REPEATABLE_READ, read_only=True):
        row = conn.execute("SELECT pg_current_snapshot()::text, clock_timestamp()").fetchone()
        assert row is not None
        assert isinstance(row[1], datetime)
        snapshot = MarkSnapshot(token=str(row[0]), taken_at=row[1])
        yield snapshot
        snapshot.in_flight.extend(in_flight_transactions(conn))


def settle_mark(
    conn: Connection,
    snapshot: MarkSnapshot,
    mark: str | None,
    *,
    settle_timeout: float | None,
    poll_interval: float = 0.05,
) -> Mark:
    """Waits out the transactions in flight at the mark's snapshot, at most ``settle_timeout``.

    Args:
        conn: The autocommit session the snapshot was read on (its transaction has ended).
        snapshot: The mark's snapshot (:func:`mark_snapshot`).
        mark: The mark read in it.
        settle_timeout: Seconds to wait; ``None``: nothing to wait for (the writers are paused).
        poll_interval: Seconds between two looks at ``pg_locks``.

    Returns:
        The mark with its evidence, and the transactions still open when the wait ran out.
    """
    waiting = snapshot.in_flight if settle_timeout is not None else []
    settled = wait_out(conn, waiting, timeout=settle_timeout or 0.0, interval=poll_interval)
    return Mark(
        mark=mark,
        taken_at=snapshot.taken_at,
        snapshot_token_digest=token_digest(snapshot.token),
        awaited=len(waiting),
        waited_seconds=settled.waited_seconds,
        unsettled=tuple(xid for xid, _ in settled.running),
        unsettled_pids=tuple(pid for _, pid in settled.running),
    )


def read_mark(
    conn: Connection,
    tables: CursorTables,
    scope: tuple[sql.Composable, list[str]] | None,
    *,
    settle_timeout: float | None,
    poll_interval: float = 0.05,
    count: bool = False,
    refusal: TableCheck | None = None,
) -> tuple[Mark, int | None]:
    """Reads the largest cursor value of ``tables``' source in one snapshot (an index probe),
    then waits out the transactions in flight at that moment.

    Args:
        conn: An autocommit source session with the digest's settings pinned.
        tables: The job's checked tables.
        scope: A condition on the source and its parameters (``None``: the whole table).
        settle_timeout: Seconds to wait (:func:`settle_mark`).
        poll_interval: Seconds between two looks at ``pg_locks``.
        count: Also count the scope's rows in the same snapshot.
        refusal: Refuse a NULL cursor in the same snapshot, before the wait, with this
            policy's check (:meth:`~.table_check.TableCheck.refuse_null`).

    Returns:
        The mark with its evidence, and the scope's rows (``None`` unless ``count``).
    """
    where, params = scope if scope is not None else (sql.SQL("TRUE"), [])
    counted = sql.SQL("count(*)" if count else "NULL::int8")
    with mark_snapshot(conn) as snapshot:
        found = conn.execute(
            sql.SQL("SELECT max({c})::text, {n} FROM {t} WHERE {w}").format(
                c=tables.cursor.ident, n=counted, t=tables.source.ident, w=where
            ),
            params,
        ).fetchone()
        if refusal is not None:
            refusal.refuse_null(conn, tables)
    assert found is not None
    mark = None if found[0] is None else str(found[0])
    settled = settle_mark(
        conn, snapshot, mark, settle_timeout=settle_timeout, poll_interval=poll_interval
    )
    return settled, None if found[1] is None else int(found[1])
