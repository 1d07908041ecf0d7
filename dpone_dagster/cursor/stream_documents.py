"""A stream's durable documents (the moving mark's): its state and batch receipts, as the ledger
store's stream tables hold them (one row per stream; :class:`.cursor_ledger.StreamLedger` keeps
them). Pure pydantic models, no I/O.

The state is a constant-size document (the mark, the run in progress and its checkpoint, what
was in flight at the mark); each committed batch adds one receipt row. Both are written in the
target transaction that holds the batch's rows, so a crash leaves all or nothing, and the state
moves by compare-and-swap on its revision under a transaction-scoped advisory lock per stream:
two runs of one stream serialize batch by batch and never apply a batch twice.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from dpone_dagster.core.documents import Count, Document, Ordinal
from dpone_dagster.core.verification import Verification
from dpone_dagster.lifecycle import ExtractionLifecycleReceipt


class Checkpoint(Document):
    """The last row a run copied, in ``(cursor, key)`` order (canonical text of each value)."""

    cursor: str
    key: tuple[str, ...]


class RunInProgress(Document):
    """A run that has taken its mark and not reached it yet.

    Attributes:
        number: The run's number in the stream (1 for the initial load).
        lower: The exclusive lower cursor bound of the run (``None``: from the start).
        mark: The inclusive upper bound (the largest cursor value at the mark's snapshot).
        taken_at: The source server's clock when the mark's snapshot was taken.
        snapshot_token_digest: Digest of the mark's snapshot.
        checkpoint: The last row copied by the run (``None`` before its first batch).
        unsettled: Virtual xids of transactions still open after the settle timeout.
        rescan_from: The lower bound the next run must read from while they stay open.
        awaited: Transactions open at the mark that were waited out.
        inserted: Rows the run's batches inserted so far.
        updated: Rows they updated.
        batches: Batches committed.
    """

    number: Ordinal
    lower: str | None
    mark: str | None
    taken_at: datetime
    snapshot_token_digest: str
    checkpoint: Checkpoint | None = None
    unsettled: tuple[str, ...] = ()
    rescan_from: str | None = None
    awaited: int = 0
    inserted: int = 0
    updated: int = 0
    batches: int = 0


class StreamState(Document):
    """The durable state of one stream (O(1) in size).

    Attributes:
        stream_id: ``incremental:<digest of source, target, cursor and key>``.
        revision: Bumped by every change; the compare-and-swap key.
        mark: Every source row with a cursor at or below it has been copied (``None``: nothing
            yet).
        mark_taken_at: The source clock when that mark was taken.
        runs: Runs completed.
        sequence: Batches committed over the stream's life.
        unsettled: Transactions that were still open at the last mark (see ``rescan_from``).
        rescan_from: While ``unsettled`` is not empty, the next run reads from this bound
            instead of ``mark``: rows those transactions commit below the mark are read again.
        run: The run in progress, if any.
        target_rows: The target's live rows as of this revision (``None``: not known). Kept in
            its own column of the state's row (ledger migration 7), not in the document, so a
            ledger an earlier release reads keeps parsing (how it moves:
            :mod:`dpone_dagster.incremental.row_count`).
    """

    stream_id: str
    revision: Ordinal = 1
    mark: str | None = None
    mark_taken_at: datetime | None = None
    runs: int = 0
    sequence: int = 0
    unsettled: tuple[str, ...] = ()
    rescan_from: str | None = None
    run: RunInProgress | None = None
    target_rows: Count | None = Field(default=None, exclude=True)


class StreamReceipt(Document):
    """What one committed batch did.

    Attributes:
        stream_id: The stream.
        sequence: The batch's number over the stream's life.
        run: The run's number.
        after: Where the batch started (exclusive).
        last: The last row it copied (``None``: no row).
        rows: Rows read and staged.
        inserted: Rows the merge inserted.
        updated: Rows the merge updated (a value differed).
        deleted: Target rows deleted (or marked, ``soft``) by the delete detection.
        keys_compared: Keys that crossed the wire for the delete detection.
        final: The batch reached the run's mark.
        extraction: The batch's read window and snapshot (its lifecycle receipt).
        verification: The final batch's comparison of whole rows, when asked for.
    """

    stream_id: str
    sequence: Ordinal
    run: Ordinal
    after: Checkpoint | None
    last: Checkpoint | None
    rows: Count
    inserted: Count
    updated: Count
    deleted: Count = 0
    keys_compared: Count = 0
    final: bool
    extraction: ExtractionLifecycleReceipt
    verification: Verification | None = None
