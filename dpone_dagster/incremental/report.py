"""What one run of a stream did, from its batch receipts in the ledger."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from psycopg import sql

from dpone_dagster.core.errors import ENGINE_ERRORS
from dpone_dagster.core.verification import Verification
from dpone_dagster.cursor.marks import Mark
from dpone_dagster.cursor.stream_documents import StreamReceipt, StreamState
from dpone_dagster.lifecycle import SnapshotLabel
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.schema_change import ColumnChange
from dpone_dagster.postgres.target_types import TargetTypes

from .shape import StreamShape


@dataclass(frozen=True)
class Notice:
    """Something the run did not fail on but an operator should know (a stable code)."""

    code: str
    message: str
    next_actions: tuple[str, ...]


@dataclass(frozen=True)
class IncrementalResult:
    """One run of a stream.

    Attributes:
        stream_id: The stream.
        run: The run's number (``None``: there was nothing to do).
        old_mark: The stream's mark before the run.
        new_mark: Its mark after the run.
        mark_taken_at: The source clock when the new mark was taken.
        lag_seconds: For a time cursor, the source clock at the newest mark taken minus the
            newest cursor value copied (``None`` for other cursors or an empty table): it grows
            while nothing changes, and drops when a run copies fresh rows.
        rows: Rows read and merged.
        inserted: Rows the target gained.
        updated: Rows updated because a value differed.
        deleted: Rows deleted (``soft``: marked).
        keys_compared: Keys that crossed the wire for the delete detection.
        batches: Batches of the run (every process's).
        batches_here: Batches this call committed (fewer when it resumed or joined a run).
        resumed: The call continued a run begun earlier (a crash, a retry, a concurrent run).
        snapshot_label: One source snapshot or several.
        snapshot_tokens: Digests of the batches' snapshots, in order.
        awaited: Transactions open at the mark that were waited out.
        notices: ``incremental_mark_unsettled`` while transactions outlive the settle timeout.
        receipts: The run's batch receipts.
        verification: The final batch's verification, when the run was verified.
        schema_changes: What the run's batches changed in the target's schema (each change
            once): added, widened and kept columns.
        target_types: What the run's batches created in the target for the table's types
            (extensions, types, enum labels; each once).
        virtual_as_stored: The source's ``VIRTUAL`` generated columns the target the run
            created defines as ``STORED`` (a target before PostgreSQL 18).
        as_of: The source clock at the newest mark taken (this call's, even when it found
            nothing new, or the stored one): the source state the target now holds, every
            transaction settled at that mark included.
        target_rows: The target's live rows after the run, as the ledger keeps them (never
            counted by a recurring run: :mod:`.row_count`); ``None`` when not known.
    """

    stream_id: str
    run: int | None
    old_mark: str | None
    new_mark: str | None
    mark_taken_at: datetime | None
    lag_seconds: float | None
    rows: int
    inserted: int
    updated: int
    deleted: int
    keys_compared: int
    batches: int
    batches_here: int
    resumed: bool
    snapshot_label: SnapshotLabel
    snapshot_tokens: tuple[str, ...]
    awaited: int
    notices: tuple[Notice, ...]
    receipts: tuple[StreamReceipt, ...]
    verification: Verification | None = None
    schema_changes: tuple[ColumnChange, ...] = ()
    target_types: TargetTypes = field(default_factory=TargetTypes)
    virtual_as_stored: tuple[str, ...] = ()
    as_of: datetime | None = None
    target_rows: int | None = None


def _as_of(state: StreamState, mark: Mark | None) -> datetime | None:
    """The source clock at the newest mark taken (this call's, or the stored one)."""
    times = [t for t in (state.mark_taken_at, mark.taken_at if mark else None) if t is not None]
    return max(times) if times else None


def _lag(
    src: Connection, shape: StreamShape, state: StreamState, mark: Mark | None
) -> float | None:
    """The source clock at the newest mark taken minus the newest cursor value copied."""
    taken_at = _as_of(state, mark)
    if not shape.cursor_is_time or state.mark is None or taken_at is None:
        return None
    row = src.execute(
        sql.SQL(
            "SELECT extract(epoch FROM %s::timestamptz - CAST(CAST(%s::text AS {}) AS"
            " timestamptz))::float8"
        ).format(sql.SQL(shape.cursor.type_sql)),
        (taken_at, state.mark),
    ).fetchone()
    assert row is not None
    return float(row[0])


def _notices(state: StreamState, mark: Mark | None) -> tuple[Notice, ...]:
    if not state.unsettled:
        return ()
    message, actions = ENGINE_ERRORS["incremental_mark_unsettled"]
    pids = (
        ""
        if mark is None
        else " (server backends " + ", ".join(map(str, mark.unsettled_pids)) + ")"
    )
    return (
        Notice(
            "incremental_mark_unsettled",
            f"{message} {len(state.unsettled)} transaction(s){pids}; the next run reads again "
            f"from {state.rescan_from or 'the start'}.",
            actions,
        ),
    )


def _label(receipts: Sequence[StreamReceipt]) -> SnapshotLabel:
    if not receipts:
        return SnapshotLabel.NO_ROWS_COPIED
    return SnapshotLabel.SINGLE_SNAPSHOT if len(receipts) == 1 else SnapshotLabel.SEVERAL_SNAPSHOTS


def build_result(
    src: Connection,
    shape: StreamShape,
    before: StreamState,
    after: StreamState,
    receipts: Sequence[StreamReceipt],
    mark: Mark | None,
    mine: int,
) -> IncrementalResult:
    """The run's result from the states around it and its receipts."""
    return IncrementalResult(
        stream_id=after.stream_id,
        run=receipts[0].run if receipts else None,
        old_mark=before.mark,
        new_mark=after.mark,
        mark_taken_at=after.mark_taken_at,
        lag_seconds=_lag(src, shape, after, mark),
        as_of=_as_of(after, mark),
        rows=sum(r.rows for r in receipts),
        inserted=sum(r.inserted for r in receipts),
        updated=sum(r.updated for r in receipts),
        deleted=sum(r.deleted for r in receipts),
        keys_compared=sum(r.keys_compared for r in receipts),
        batches=len(receipts),
        batches_here=mine,
        resumed=mark is None and bool(receipts),
        snapshot_label=_label(receipts),
        snapshot_tokens=tuple(r.extraction.source_token or "" for r in receipts),
        awaited=0 if mark is None else mark.awaited,
        notices=_notices(after, mark),
        receipts=tuple(receipts),
        verification=receipts[-1].verification if receipts else None,
        target_rows=after.target_rows,
    )
