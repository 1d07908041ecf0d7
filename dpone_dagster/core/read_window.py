"""A read window: when a source read began and ended under which snapshot, by the server's clock.

Every engine batch reads the source inside its own ``REPEATABLE READ READ ONLY`` transaction.
:func:`open_read_window` records that transaction's snapshot token and the server's clock in a
new lifecycle authority (a real vendor snapshot, so the receipt may claim it), and
:func:`close_read_window` completes the receipt once every row of the read was consumed.
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

SERVER_CLOCK = "postgresql.clock_timestamp"
"""The clock authority of every engine receipt: the source server's ``clock_timestamp()``."""
SNAPSHOT_AUTHORITY = "postgresql.pg_current_snapshot"
"""The snapshot authority of every engine receipt."""


@dataclass(frozen=True)
class ReadWindow:
    """A read's lifecycle authority (snapshot and clock acquired) and the snapshot's ``xmin``."""

    authority: ExtractionLifecycleAuthority
    xmin: int


def open_read_window(src: Connection) -> ReadWindow:
    """Records the source transaction's snapshot and clock in a new lifecycle authority (the
    session must be inside its ``REPEATABLE READ`` transaction)."""
    snap = src.execute(
        "SELECT clock_timestamp(), pg_current_snapshot()::text, clock_timestamp()"
    ).fetchone()
    assert snap is not None
    started, token, acquired = snap
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
    return ReadWindow(authority, int(str(token).split(":", 1)[0]))


def close_read_window(
    src: Connection, window: ReadWindow, rows: int, byte_count: int
) -> ExtractionLifecycleReceipt:
    """The read's lifecycle receipt: ``rows`` and ``byte_count`` read, completed at the server's
    clock."""
    done = src.execute("SELECT clock_timestamp()").fetchone()
    assert done is not None
    assert isinstance(done[0], datetime)
    return window.authority.complete(row_count=rows, byte_count=byte_count, completed_at=done[0])
