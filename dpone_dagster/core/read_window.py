"""A read window: when a source read began and ended under which snapshot, by the server's clock.

Every engine batch reads the source inside its own ``REPEATABLE READ READ ONLY`` transaction.
:func:`open_read_window` records that transaction's snapshot token and the server's clock in a
new lifecycle authority (a real vendor snapshot, so the receipt may claim it), and
:func:`close_read_window` completes the receipt once every row of the read was consumed.

The window also records the oldest transaction of the source database the snapshot may have
seen in flight (:attr:`ReadWindow.xmin`): every row version of the database's tables written by
an older transaction was visible to the snapshot, which lets the reconciliation prove rows
unchanged without hashing them (:mod:`dpone_dagster.reconcile.row_versions`). A snapshot's own
``xmin`` is cluster-wide: one writer left open in another database holds it back, and every row
written since would then look too new to prove. A transaction in another database cannot write
this database's tables, so an in-flight id whose backend is connected to another database is
left out. Everything else stays in: an id whose backend has already ended (its database can no
longer be told), a backend without a database, and any id whose ``pg_stat_activity`` row the
session may not read. A subtransaction of a writer of this database has an id above its
top-level id, which is kept, so its rows stay too new to prove.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from dpone_dagster.lifecycle import (
    ExtractionLifecycleAuthority,
    ExtractionLifecycleReceipt,
    SnapshotEvidence,
)
from dpone_dagster.postgres.connection import Connection

from .in_flight import READER_LOCK

SERVER_CLOCK = "postgresql.clock_timestamp"
"""The clock authority of every engine receipt: the source server's ``clock_timestamp()``."""
SNAPSHOT_AUTHORITY = "postgresql.pg_current_snapshot"
"""The snapshot authority of every engine receipt."""


# The read transaction's first statement: it takes the snapshot, and the reader's lock that tells
# the marks this read-only transaction can commit no row (dpone_dagster.core.in_flight).
_OPEN = """
SELECT clock_timestamp(), s::text, clock_timestamp(), coalesce(
    (SELECT min(x) FROM pg_snapshot_xip(s) AS x
     WHERE (x::text::bigint %% 4294967296)::text NOT IN (
         SELECT backend_xid::text FROM pg_stat_activity
         WHERE backend_xid IS NOT NULL AND datname <> current_database())),
    pg_snapshot_xmax(s))::text, pg_advisory_xact_lock_shared(%s)
FROM pg_current_snapshot() AS s
"""


@dataclass(frozen=True)
class ReadWindow:
    """A read's lifecycle authority (snapshot and clock acquired), and the oldest transaction of
    the source database the snapshot may have seen in flight (64-bit; see the module's
    docstring): every older writer of the database's tables had ended."""

    authority: ExtractionLifecycleAuthority
    xmin: int


def open_read_window(src: Connection) -> ReadWindow:
    """Records the source transaction's snapshot and clock in a new lifecycle authority (the
    session must be inside its ``REPEATABLE READ READ ONLY`` transaction), and takes the shared
    lock :data:`~dpone_dagster.core.in_flight.READER_LOCK` until it ends: a mark taken meanwhile
    does not wait for this read (it can commit no row)."""
    snap = src.execute(_OPEN, (READER_LOCK,)).fetchone()
    assert snap is not None
    started, token, acquired, oldest, _ = snap
    assert isinstance(started, datetime)
    assert isinstance(acquired, datetime)
    authority = ExtractionLifecycleAuthority()
    authority.acquire(started_at=started, clock_authority=SERVER_CLOCK)
    authority.acquire_snapshot(
        SnapshotEvidence(
            authority=SNAPSHOT_AUTHORITY,
            token=str(token),
            acquired_at=acquired,
            clock_authority=SERVER_CLOCK,
        )
    )
    return ReadWindow(authority, int(str(oldest)))


def close_read_window(
    src: Connection, window: ReadWindow, rows: int, byte_count: int
) -> ExtractionLifecycleReceipt:
    """The read's lifecycle receipt: ``rows`` and ``byte_count`` read, completed at the server's
    clock."""
    done = src.execute("SELECT clock_timestamp()").fetchone()
    assert done is not None
    assert isinstance(done[0], datetime)
    return window.authority.complete(row_count=rows, byte_count=byte_count, completed_at=done[0])
