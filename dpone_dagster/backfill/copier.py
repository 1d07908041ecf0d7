"""One batch: read a keyset slice under its own snapshot, COPY it, commit it with its receipt.

The seed fetched each batch as JSON rows and inserted them one by one (about 0.01 of the raw
COPY pipe). Here a batch is:

1. Under the run's advisory lock (ledger session), the durable run and any receipt already
   stored for this batch id are read: a stored receipt with the same digest is a lost response
   and is answered by replay; anything else that does not build on the durable checkpoint is
   refused (:func:`rules.check_request`).
2. The source opens a ``REPEATABLE READ READ ONLY`` transaction; its snapshot token, clock and
   read window go into a lifecycle receipt. Inside it one index-only scan finds the batch's
   upper bound (the ``batch_size``-th cursor value after the checkpoint, at most the mark) and
   counts the range; a cursor that is not the whole primary key recounts with the rows tied on
   the bound, so equal cursor values never straddle two batches.
3. The range streams as binary COPY, block by block (memory stays flat; :mod:`.stream`),
   straight into the target inside a savepoint, its bytes hashed on the way (the content hash).
   If a row of the batch already exists in the target (a unique violation), the savepoint is
   rolled back and the same snapshot is copied again into a temporary staging table, then
   applied set-based (:mod:`.staged`): new rows inserted, equal rows counted as duplicates, a
   differing row refused with ``backfill_record_changed``. (Staging every batch would cost an
   extra pass of the executor per row; it only pays when rows exist.)
4. The target counts the range (a direct COPY also records the row-version evidence that lets
   the final reconciliation prove the range unchanged without hashing it, :mod:`.row_versions`),
   the pure rule checks order and counts, and the receipt and the advanced run are written to
   the ledger: in the target's own transaction when the ledger is
   there (one COMMIT for rows and receipt), else right after the target's commit.

Where the time goes, at 50,000-row batches on two cores: about nine tenths in the relay; per
batch, about 5 ms for the bounds scan, 8 ms for the target count and 3-7 ms for the commit.
Overlapping those with the next batch's relay (a second target session, the advisory lock taken
after the copy) measured 0-9 % faster and would change the concurrency protocol; it is not done.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from psycopg import pq, sql

from dpone_dagster.lifecycle import ExtractionLifecycleAuthority, SnapshotEvidence
from dpone_dagster.postgres.copy import EMPTY_HASH, copy_in_statement, copy_out_statement, relay
from dpone_dagster.postgres.evidence import RowVersionEvidence, written_rows
from dpone_dagster.postgres.identifiers import TableName

from .errors import backfill_error
from .existing_rows import apply_existing
from .ledger import Ledger
from .protocol import (
    ApplyPath,
    BackfillRun,
    BatchObservation,
    BatchReceipt,
    BatchRequest,
)
from .rules import apply_batch, check_request, replay
from .shape import TableShape

Conn = psycopg.Connection[tuple[object, ...]]
PhaseHook = Callable[[str], None]

SERVER_CLOCK = "postgresql.clock_timestamp"
SNAPSHOT_AUTHORITY = "postgresql.pg_current_snapshot"


@dataclass
class Sessions:
    """The autocommit sessions one batch uses; ``ledger`` is ``target`` when the ledger is there."""

    source: Conn
    target: Conn
    ledger: Conn

    @property
    def ledger_in_target(self) -> bool:
        """True when rows and receipt share one transaction."""
        return self.ledger is self.target

    def abandon(self) -> None:
        """Ends any open transaction; a session that cannot answer is closed (server rolls back)."""
        for conn in {id(c): c for c in (self.source, self.target, self.ledger)}.values():
            if conn.closed:
                continue
            status = conn.info.transaction_status
            if status is pq.TransactionStatus.IDLE:
                continue
            try:
                if conn.broken or status is pq.TransactionStatus.ACTIVE:
                    raise psycopg.OperationalError("session busy or broken")
                conn.execute("ROLLBACK", prepare=False)
            except psycopg.Error:
                conn.close()


@dataclass(frozen=True)
class BatchResult:
    """A committed batch: the run after it, its receipt, and whether it was a replay."""

    run: BackfillRun
    receipt: BatchReceipt
    replayed: bool


_HEAD = """SELECT count(*), min(c)::text, max(c)::text FROM (
    SELECT src.{c} AS c FROM {t} AS src WHERE {w} ORDER BY src.{c} LIMIT %s) AS head"""


@dataclass(frozen=True)
class _Bounds:
    """The batch's range ``(after, upper]`` and what it holds, read inside its snapshot."""

    upper: str
    final: bool
    count: int
    first: str | None
    last: str | None


def _count_range(
    conn: Conn, shape: TableShape, table: TableName, after: str | None, upper: str
) -> int:
    """``count(*)`` of ``table``'s rows in ``(after, upper]``."""
    where, params = shape.where(after, upper)
    row = conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE {}").format(table.ident, where), params
    ).fetchone()
    assert row is not None
    assert isinstance(row[0], int)
    return row[0]


def _bounds(src: Conn, shape: TableShape, after: str | None, hwm: str, size: int) -> _Bounds:
    """The first ``size`` cursor values after ``after`` (at most the mark), counted in the same
    index scan; a cursor that is not unique adds the rows tied with the last value, so a batch
    never splits equal cursor values."""
    where, params = shape.where(after, hwm)
    row = src.execute(
        sql.SQL(_HEAD).format(c=shape.cursor.ident, t=shape.source.ident, w=where),
        [*params, size],
    ).fetchone()
    assert row is not None
    count = int(row[0])  # type: ignore[call-overload]
    first = None if row[1] is None else str(row[1])
    last = None if row[2] is None else str(row[2])
    if count < size:  # the rest of the scope: the range runs to the mark
        return _Bounds(hwm, True, count, first, last)
    assert last is not None
    if shape.key != (shape.cursor.name,):  # the cursor alone is not the key: ties may follow
        count = _count_range(src, shape, shape.source, after, last)
    return _Bounds(last, last == hwm, count, first, last)


def _move(
    sessions: Sessions, shape: TableShape, request: BatchRequest, on_phase: PhaseHook
) -> BatchObservation:
    """Reads the batch under its own snapshot and writes it into the open target transaction."""
    src, tgt = sessions.source, sessions.target
    authority = ExtractionLifecycleAuthority()
    src.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", prepare=False)
    snap = src.execute(
        "SELECT clock_timestamp(), pg_current_snapshot()::text, clock_timestamp()"
    ).fetchone()
    assert snap is not None
    authority.acquire(started_at=snap[0], clock_authority=SERVER_CLOCK)  # type: ignore[arg-type]
    authority.acquire_snapshot(
        SnapshotEvidence(
            authority=SNAPSHOT_AUTHORITY,
            token=str(snap[1]),
            acquired_at=snap[2],
            clock_authority=SERVER_CLOCK,
        )
    )
    hwm, after = request.source_high_water_mark, request.after
    upper: str | None = None
    final, count = True, 0
    first: str | None = None
    last: str | None = None
    out_n = in_n = moved = copied = equal = target_count = 0
    content, path = EMPTY_HASH, ApplyPath.NONE
    versions: RowVersionEvidence | None = None
    if hwm is not None:
        bounds = _bounds(src, shape, after, hwm, request.batch_size)
        upper, final, count = bounds.upper, bounds.final, bounds.count
        first, last = bounds.first, bounds.last
        on_phase("copy")
        select, params = shape.select_range(shape.source, after, upper)
        copy_out = copy_out_statement(select, shape.fmt)
        tgt.execute("SAVEPOINT dpone_batch", prepare=False)
        try:
            relayed = relay(
                src,
                copy_out,
                tgt,
                copy_in_statement(shape.target, shape.columns, shape.fmt),
                params=params,
                hashed=True,
            )
            copied, path = relayed.rows_in, ApplyPath.DIRECT
        except psycopg.errors.UniqueViolation:
            tgt.execute("ROLLBACK TO SAVEPOINT dpone_batch", prepare=False)
            staged = apply_existing(src, tgt, shape, copy_out, params)
            relayed, copied, equal = staged.relayed, staged.inserted, staged.duplicates
            path = ApplyPath.STAGED
        out_n, in_n = relayed.rows_out, relayed.rows_in
        moved, content = relayed.bytes, relayed.content_hash or EMPTY_HASH
        tgt.execute("RELEASE SAVEPOINT dpone_batch", prepare=False)
        if path is ApplyPath.DIRECT and shape.versions is not None and first is not None:
            probe = sql.SQL("{} = {}").format(shape.cursor.ident, shape.value())
            counted, versions = written_rows(
                tgt, shape.target, shape.versions, where=shape.where(after, upper),
                first=(probe, [first]), source_xmin=int(str(snap[1]).split(":", 1)[0]),
            )  # fmt: skip
            target_count = counted or 0
        else:
            target_count = _count_range(tgt, shape, shape.target, after, upper)
    done = src.execute("SELECT clock_timestamp()").fetchone()
    assert done is not None
    receipt = authority.complete(row_count=out_n, byte_count=moved, completed_at=done[0])  # type: ignore[arg-type]
    src.execute("COMMIT", prepare=False)
    return BatchObservation(
        upper=upper,
        first_cursor=first,
        last_cursor=last,
        source_count=count,
        copy_out_count=out_n,
        copy_in_count=in_n,
        target_count=target_count,
        copied_count=copied,
        duplicate_count=equal,
        content_hash=content,
        byte_count=moved,
        final=final,
        apply_path=path,
        extraction=receipt,
        row_versions=versions,
    )


def copy_batch(
    sessions: Sessions,
    ledger: Ledger,
    shape: TableShape,
    request: BatchRequest,
    *,
    on_phase: PhaseHook = lambda _: None,
) -> BatchResult:
    """Copies and commits one batch, or answers it by replay.

    Any failure (including a ``BaseException`` such as an interrupt) rolls back every open
    transaction before it propagates: the durable checkpoint stays where it was.

    Raises:
        BackfillError: from the rules (stale, unordered, changed...) and the staged apply.
        psycopg.Error: a session failed; nothing of the batch was committed unless the failure
            hit the COMMIT itself (the caller resolves that by replay).
    """
    lc, tgt = sessions.ledger, sessions.target
    try:
        lc.execute("BEGIN ISOLATION LEVEL READ COMMITTED", prepare=False)
        ledger.lock_run(lc, request.run_id)
        durable = ledger.fetch_run(lc, request.run_id)
        if durable is None:
            raise backfill_error("backfill_run_invalid", f"The ledger has no run {request.run_id}.")
        stored = replay(request, ledger.fetch_receipt(lc, request.run_id, request.batch_id))
        if stored is not None:
            lc.execute("COMMIT", prepare=False)
            return BatchResult(durable, stored, replayed=True)
        check_request(durable, request)
        if not sessions.ledger_in_target:
            tgt.execute("BEGIN ISOLATION LEVEL READ COMMITTED", prepare=False)
        seen = _move(sessions, shape, request, on_phase)
        run, receipt = apply_batch(durable, request, seen)
        on_phase("commit")
        if not sessions.ledger_in_target:
            tgt.execute(
                "COMMIT", prepare=False
            )  # rows first: a crash before the receipt is repaired by replay
        ledger.record_batch(lc, durable, run, receipt)
        lc.execute("COMMIT", prepare=False)
    except BaseException:
        sessions.abandon()
        raise
    on_phase("committed")
    return BatchResult(run, receipt, replayed=False)
