"""One batch: read a keyset slice under its own snapshot, COPY it, commit it with its receipt
through the cursor engine's batch-commit protocol (:mod:`dpone_dagster.cursor.batch_commit`:
the lock, the compare-and-swap, the COMMIT and a lost answer to it).

A batch is:

1. Under the run's advisory lock (ledger session), the durable run and any receipt already
   stored for this batch id are read: a stored receipt with the same digest is a lost response
   and is answered by replay; anything else that does not build on the durable checkpoint is
   refused (:func:`rules.check_request`).
2. The source opens a ``REPEATABLE READ READ ONLY`` transaction; its snapshot token, clock and
   read window go into a lifecycle receipt. Inside it one index-only scan finds the batch's
   upper bound (the ``batch_size``-th cursor value after the checkpoint, at most the mark) and
   counts the range; a cursor that is not the whole primary key recounts with the rows tied on
   the bound, so equal cursor values never straddle two batches.
3. The range streams as binary COPY, block by block (memory stays flat; the relay of
   :mod:`dpone_dagster.postgres.copy`), straight into the target inside a savepoint, its bytes
   hashed on the way (the content hash). If a row of the batch already exists in the target (a
   unique violation), only the savepoint is rolled back and the same snapshot is copied again
   into a temporary staging table, then applied set-based (:mod:`.existing_rows`): new rows
   inserted, equal rows counted as duplicates, a differing row refused with
   ``backfill_record_changed``. (Staging every batch would cost an extra pass of the executor
   per row; it only pays when rows exist.)
4. The target's count of the range: after a direct COPY into a range that held no row when
   the batch began (one index probe, before the COPY) of a table without user triggers, the
   rows in the range are exactly the rows the target's COPY inserted, so its command tag is the
   count and the range is not read again; otherwise the target counts the range. A direct COPY
   also records the row-version evidence that lets the final reconciliation prove the range
   unchanged without hashing it (:mod:`dpone_dagster.postgres.evidence`). The pure rules check
   order and counts, and the receipt and the advanced run are written to the ledger: in the
   target's own transaction when the ledger is there (one COMMIT for rows and receipt), else
   right after the target's commit.

A keyless load (the run that created its target with the key deferred, :mod:`.deferred_key`)
skips the savepoint and the probe of step 3: no key can refuse a row, every row of the range is
the batch's own (the cursor is the whole key, and the run admits each range once), so the count
is the tag and the evidence is the batch transaction's own id, and nothing is read back.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import IsolationLevel, sql

from dpone_dagster.core.errors import engine_error
from dpone_dagster.core.read_window import close_read_window, open_read_window
from dpone_dagster.core.sessions import Sessions, transaction
from dpone_dagster.cursor.backfill_documents import (
    ApplyPath,
    BackfillRun,
    BatchObservation,
    BatchReceipt,
    BatchRequest,
)
from dpone_dagster.cursor.batch_commit import Answered, Landed, PhaseHook, commit_batch
from dpone_dagster.cursor.cursor_ledger import RunLedger
from dpone_dagster.cursor.range_checks import OnChanged
from dpone_dagster.cursor.run_rules import apply_batch, check_request, replay
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.copy import (
    EMPTY_HASH,
    RelayResult,
    copy_in_statement,
    copy_out_statement,
    relay,
)
from dpone_dagster.postgres.evidence import RowVersionEvidence, own_writes, written_rows
from dpone_dagster.postgres.identifiers import TableName

from .existing_rows import apply_existing
from .shape import TableShape, check_columns_unchanged


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

    upper: str | None
    final: bool
    count: int
    first: str | None
    last: str | None


@dataclass(frozen=True)
class _Moved:
    """What reached the target: the relay's tags, bytes and hash, and how the rows were applied."""

    relayed: RelayResult
    copied: int
    duplicates: int
    path: ApplyPath


@dataclass(frozen=True)
class _Counted:
    """The target's count of the range after the copy, and its row-version evidence if any."""

    rows: int
    versions: RowVersionEvidence | None


_NO_ROWS = _Bounds(upper=None, final=True, count=0, first=None, last=None)
"""A scope that held no row at the mark: one empty, final batch."""
_NOTHING_MOVED = _Moved(RelayResult(0, 0, 0, EMPTY_HASH), 0, 0, ApplyPath.NONE)
_NOTHING_COUNTED = _Counted(0, None)


_COUNT = "SELECT count(*) FROM {t} WHERE {w}"
_EMPTY = "SELECT NOT EXISTS (SELECT FROM {t} WHERE {w})"
"""Whether the range holds no row: an index probe, not a count."""


def _over_range(
    conn: Connection,
    shape: TableShape,
    table: TableName,
    after: str | None,
    upper: str | None,
    query: str,
) -> object:
    """The one value ``query`` (``_COUNT`` or ``_EMPTY``) answers over ``table``'s rows in
    ``(after, upper]``."""
    where, params = shape.where(after, upper)
    row = conn.execute(sql.SQL(query).format(t=table.ident, w=where), params).fetchone()
    assert row is not None
    return row[0]


def _count_range(
    conn: Connection, shape: TableShape, table: TableName, after: str | None, upper: str | None
) -> int:
    """``count(*)`` of ``table``'s rows in ``(after, upper]``."""
    return int(str(_over_range(conn, shape, table, after, upper, _COUNT)))


def _bounds(src: Connection, shape: TableShape, after: str | None, hwm: str, size: int) -> _Bounds:
    """The first ``size`` cursor values after ``after`` (at most the mark), counted in the same
    index scan; a cursor that is not unique adds the rows tied with the last value, so a batch
    never splits equal cursor values."""
    where, params = shape.where(after, hwm)
    row = src.execute(
        sql.SQL(_HEAD).format(c=shape.cursor.ident, t=shape.source.ident, w=where),
        [*params, size],
    ).fetchone()
    assert row is not None
    count = int(row[0])
    first = None if row[1] is None else str(row[1])
    last = None if row[2] is None else str(row[2])
    if count < size:  # the rest of the scope: the range runs to the mark
        return _Bounds(hwm, True, count, first, last)
    assert last is not None
    if shape.key_names != (shape.cursor.name,):  # the cursor alone is not the key: ties may follow
        count = _count_range(src, shape, shape.source, after, last)
    return _Bounds(last, last == hwm, count, first, last)


def _copy(
    sessions: Sessions, shape: TableShape, after: str | None, upper: str | None, overwrite: bool
) -> _Moved:
    """Copies the range into the open target transaction, hashing the COPY stream.

    A direct COPY runs inside a savepoint; when a row of the range already exists in the target
    (a unique violation) only the savepoint is rolled back, and the same snapshot is copied again
    through the staged apply (which, with ``overwrite``, replaces existing rows that differ).
    A keyless load (:mod:`.deferred_key`) copies without a savepoint: no key refuses a row, and
    the rows carry the batch transaction's own id.
    """
    src, tgt = sessions.source, sessions.target
    select, params = shape.select_range(shape.source, after, upper)
    copy_out = copy_out_statement(select, shape.fmt)
    copy_in = copy_in_statement(shape.target, shape.columns, shape.fmt)
    if shape.keyless:
        relayed = relay(src, copy_out, tgt, copy_in, params=params, hashed=True)
        return _Moved(relayed, relayed.rows_in, 0, ApplyPath.DIRECT)
    try:
        with tgt.transaction(savepoint_name="dpone_batch"):
            relayed = relay(src, copy_out, tgt, copy_in, params=params, hashed=True)
        return _Moved(relayed, relayed.rows_in, 0, ApplyPath.DIRECT)
    except psycopg.errors.UniqueViolation:
        staged = apply_existing(src, tgt, shape, copy_out, params, overwrite=overwrite)
        return _Moved(staged.relayed, staged.inserted, staged.duplicates, ApplyPath.STAGED)


def _count_target(
    tgt: Connection,
    shape: TableShape,
    after: str | None,
    bounds: _Bounds,
    moved: _Moved,
    xmin: int,
    was_empty: bool,
) -> _Counted:
    """The target's count of the range after the copy.

    After a direct COPY into a table whose row versions can prove its content, the count also
    takes the evidence of who wrote the rows (with the batch snapshot's ``xmin``), which lets the
    final reconciliation prove the range without hashing it (:func:`written_rows`). When the
    range held no row before the COPY (``was_empty``) and the table has no user trigger (the
    evidence is taken only then), the range now holds exactly the rows the COPY inserted: its
    command tag is the count, and the range is not read again.
    A keyless load's rows are all the batch transaction's own: its count is the tag, its
    evidence that transaction's id (:func:`own_writes`), and nothing is read.
    """
    if shape.keyless:
        versions = None
        if shape.versions is not None and moved.relayed.rows_in:
            versions = own_writes(tgt, shape.versions, source_xmin=xmin)
        return _Counted(moved.relayed.rows_in, versions)
    if moved.path is ApplyPath.DIRECT and shape.versions is not None and bounds.first is not None:
        probe = sql.SQL("{} = {}").format(shape.cursor.ident, shape.value())
        counted, versions = written_rows(
            tgt, shape.target, shape.versions, where=shape.where(after, bounds.upper),
            first=(probe, [bounds.first]), source_xmin=xmin, count=False,
        )  # fmt: skip
        if not (was_empty and versions is not None):
            counted = _count_range(tgt, shape, shape.target, after, bounds.upper)
        return _Counted(moved.relayed.rows_in if counted is None else counted, versions)
    return _Counted(_count_range(tgt, shape, shape.target, after, bounds.upper), None)


def _move(
    sessions: Sessions, shape: TableShape, request: BatchRequest, on_phase: PhaseHook,
    overwrite: bool,
) -> BatchObservation:  # fmt: skip
    """Reads the batch under its own snapshot and writes it into the open target transaction."""
    src, after, hwm = sessions.source, request.after, request.source_high_water_mark
    bounds, moved, counted = _NO_ROWS, _NOTHING_MOVED, _NOTHING_COUNTED
    with transaction(src, IsolationLevel.REPEATABLE_READ, read_only=True):
        window = open_read_window(src)
        if hwm is not None:
            bounds = _bounds(src, shape, after, hwm, request.batch_size)
            check_columns_unchanged(src, shape)
            tgt = sessions.target
            # Only a table whose row versions prove its content takes its count from the tag.
            was_empty = (
                shape.versions is not None
                and not shape.keyless
                and (_over_range(tgt, shape, shape.target, after, bounds.upper, _EMPTY) is True)
            )
            on_phase("copy")
            moved = _copy(sessions, shape, after, bounds.upper, overwrite)
            counted = _count_target(tgt, shape, after, bounds, moved, window.xmin, was_empty)
        extraction = close_read_window(src, window, moved.relayed.rows_out, moved.relayed.bytes)
    return BatchObservation(
        upper=bounds.upper,
        first_cursor=bounds.first,
        last_cursor=bounds.last,
        source_count=bounds.count,
        copy_out_count=moved.relayed.rows_out,
        copy_in_count=moved.relayed.rows_in,
        target_count=counted.rows,
        copied_count=moved.copied,
        duplicate_count=moved.duplicates,
        content_hash=moved.relayed.content_hash or EMPTY_HASH,
        byte_count=moved.relayed.bytes,
        final=bounds.final,
        apply_path=moved.path,
        extraction=extraction,
        row_versions=counted.versions,
    )


@dataclass(frozen=True)
class AppendBatch:
    """How a fixed mark's batch lands (the cursor engine's batch-commit protocol calls
    :meth:`admit` then :meth:`land`): the requested range appended by a direct COPY, staged
    when rows of it exist; its ranges are reconciled when the run reaches its mark
    (:mod:`.reconcile`).

    Attributes:
        sessions: The run's sessions.
        ledger: The run's records.
        shape: The run's tables.
        request: The batch asked for.
        on_changed: What a row the target holds with other values does (``fail``,
            ``repair``).
        on_phase: The batch's phase calls.
    """

    sessions: Sessions
    ledger: RunLedger
    shape: TableShape
    request: BatchRequest
    on_changed: OnChanged = OnChanged.FAIL
    on_phase: PhaseHook = lambda _: None

    def admit(
        self, conn: Connection, durable: BackfillRun | None
    ) -> BackfillRun | Answered[BatchResult]:
        """The durable run the batch builds on, or the stored receipt of the same request (a
        lost response, replayed).

        Raises:
            EngineError: ``backfill_run_invalid`` (no run), the request's refusals
                (:func:`~dpone_dagster.cursor.run_rules.check_request`).
        """
        request = self.request
        if durable is None:
            raise engine_error("backfill_run_invalid", f"The ledger has no run {request.run_id}.")
        stored = replay(request, self.ledger.receipt(conn, request.run_id, request.batch_id))
        if stored is not None:
            return Answered(BatchResult(durable, stored, replayed=True))
        check_request(durable, request)
        return durable

    def land(self, durable: BackfillRun) -> tuple[Landed[BackfillRun, BatchReceipt], None]:
        """Copies the range under its own snapshot; the run and receipt after it."""
        repair = self.on_changed is OnChanged.REPAIR
        seen = _move(self.sessions, self.shape, self.request, self.on_phase, repair)
        run, receipt = apply_batch(durable, self.request, seen)
        return Landed(run, receipt), None


def copy_batch(
    sessions: Sessions,
    ledger: RunLedger,
    shape: TableShape,
    request: BatchRequest,
    *,
    on_phase: PhaseHook = lambda _: None,
    on_changed: OnChanged = OnChanged.FAIL,
) -> BatchResult:
    """Copies and commits one batch (an :class:`AppendBatch`) through the cursor engine's
    batch-commit protocol (:func:`~dpone_dagster.cursor.batch_commit.commit_batch`), or answers
    it by replay.

    A row of the batch that the target already holds with other values (the source changed it,
    or moved its cursor value into this batch's range, after an earlier batch copied it) is
    refused with ``backfill_record_changed``, or with ``on_changed="repair"`` replaced by the
    batch's row (counted as copied).

    Any failure (including a ``BaseException`` such as an interrupt) rolls back every open
    transaction before it propagates: the durable checkpoint stays where it was.

    Raises:
        EngineError: from the rules (stale, unordered, changed...) and the staged apply.
        LostCommitError: the ledger's COMMIT answer was lost (the caller resolves it by
            replay).
        psycopg.Error: a session failed; nothing of the batch was committed unless the failure
            hit the target's COMMIT with the ledger elsewhere (also resolved by replay).
    """
    landing = AppendBatch(sessions, ledger, shape, request, on_changed, on_phase)
    done = commit_batch(
        sessions, ledger, request.run_id, landing.admit, landing.land, on_phase=on_phase
    )
    if isinstance(done, Answered):
        return done.answer
    return BatchResult(done.after, done.receipt, replayed=False)
