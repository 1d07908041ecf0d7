"""The backfill protocol's documents: boundary, scope, run, batch request, batch receipt.

These are pure pydantic models (no I/O) carrying the ordered backfill's guarantees (the
docs' "Ordered backfill" page states them, each with its test):

* The run is O(1) in size: counts, the last checkpoint and a bounded set of evidence (one entry
  per kind, replaced, never appended), so a checkpoint costs the same at the millionth row as at
  the first. Receipts live in ledger rows, one per batch.
* A :class:`BatchRequest` names a slice of the source (after which cursor value, how many rows,
  up to which mark), never its records: the data moves with COPY, server to server, and the
  batch's content is bound into its receipt by the hash of its COPY stream.
* Cursor values and names are exact strings; names reach SQL only through ``psycopg.sql`` in the
  layers below, so any legal identifier works (``"Order Items"`` included).

All documents are frozen: a new state is a new document.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Final, Literal

from pydantic import Field

from dpone_dagster.core.documents import Count, Document, Ordinal
from dpone_dagster.lifecycle import ExtractionLifecycleReceipt, SnapshotLabel
from dpone_dagster.postgres.evidence import RowVersionEvidence

BACKFILL_PROTOCOL: Final = "dpone.backfill.v1"
"""The protocol tag every run document carries."""


class TrustworthyCursor(Document):
    """The source has a cursor whose values grow with commit order, and a high-water mark.

    Attributes:
        cursor: The cursor column's exact name.
        source_high_water_mark: The largest cursor value of the scope, read inside one source
            snapshot once every transaction in flight at that moment had finished. ``None``
            when the scope held no row at the mark.
    """

    kind: Literal["trustworthy_cursor"] = "trustworthy_cursor"
    cursor: str = Field(min_length=1)
    source_high_water_mark: str | None


class BoundedWritePause(Document):
    """Writers are paused for the run's duration (the operator vouches), with a high-water mark.

    Attributes:
        cursor: The ordering column (need not grow with commit order: nothing is written).
        source_high_water_mark: The largest cursor value of the scope at the mark.
        pause_reference: Who or what guarantees the pause (a ticket, a maintenance window).
    """

    kind: Literal["bounded_write_pause"] = "bounded_write_pause"
    cursor: str = Field(min_length=1)
    source_high_water_mark: str | None
    pause_reference: str = Field(min_length=1)


class MissingBoundary(Document):
    """Neither a trustworthy cursor nor a write pause: refused (``backfill_cursor_missing``)."""

    kind: Literal["missing"] = "missing"


Boundary = Annotated[
    TrustworthyCursor | BoundedWritePause | MissingBoundary, Field(discriminator="kind")
]
"""Where the backfill stops, and why that stop is trustworthy."""


class TableRef(Document):
    """An exact schema-qualified table name inside a named database."""

    database: str = Field(min_length=1)
    schema_name: str = Field(min_length=1)
    name: str = Field(min_length=1)


class BackfillScope(Document):
    """What one run copies. The run id is the digest of the scope.

    Attributes:
        label: A caller's name for the copy, to tell apart servers whose databases share names.
        source: The source table.
        target: The target table.
        cursor: The cursor column.
        cursor_type: The cursor's type (``bigint``, ``timestamp with time zone``...).
        key: The primary-key columns that identify a row on both sides.
        columns: The copied columns, in order.
        copy_format: ``binary`` or ``text`` (user-defined types).
        lower: The partition's exclusive lower bound as cursor text (``None``: unbounded).
        upper: The partition's inclusive upper bound as cursor text (``None``: unbounded).
    """

    label: str = ""
    source: TableRef
    target: TableRef
    cursor: str = Field(min_length=1)
    cursor_type: str = Field(min_length=1)
    key: tuple[str, ...] = Field(min_length=1)
    columns: tuple[str, ...] = Field(min_length=1)
    copy_format: Literal["binary", "text"] = "binary"
    lower: str | None = None
    upper: str | None = None


class BackfillStatus(StrEnum):
    """Where a run stands."""

    PLANNED = "planned"
    IN_PROGRESS = "in_progress"
    SUCCEEDED = "succeeded"
    BLOCKED = "blocked"


class BackfillProgress(Document):
    """The run's position: constant size however many batches were applied.

    Attributes:
        batch_count: Batches committed.
        copied_count: Rows inserted into the target.
        duplicate_count: Rows found already present and equal.
        source_high_water_mark: Copied from the boundary (checked by the integrity rule).
        rows_at_boundary: Rows of the scope at the mark (counted inside the mark's snapshot).
        remaining_estimate: ``rows_at_boundary`` minus the rows accounted for so far.
        checkpoint: The last batch receipt's checkpoint (``None`` before the first batch).
        next_after: The cursor value the next batch starts strictly after.
    """

    batch_count: Count = 0
    copied_count: Count = 0
    duplicate_count: Count = 0
    source_high_water_mark: str | None
    rows_at_boundary: Count
    remaining_estimate: Count
    checkpoint: str | None = None
    next_after: str | None = None


class BackfillEvidence(Document):
    """One piece of evidence; a run keeps at most one per ``kind`` (the newest)."""

    kind: str = Field(min_length=1)
    subject: str
    digest: str
    detail: str


class BackfillEffects(Document):
    """What the run did to the world. Mutating the source or claiming authority is invalid."""

    reads_scoped_source_data: bool = False
    copies_target_data: bool = False
    mutates_source_data: bool = False
    changes_authority: bool = False
    emits_business_effects: bool = False


class BackfillRun(Document):
    """The durable run document (one ledger row, O(1) in size).

    Attributes:
        protocol: :data:`BACKFILL_PROTOCOL`.
        run_id: ``backfill:<scope digest>``: a restart finds its run from the scope alone.
        run_digest: Digest of every other field (integrity rule).
        revision: Bumped by every durable change; the ledger's compare-and-swap key.
        status: planned, in_progress, succeeded or blocked.
        scope: What is copied.
        boundary: Where it stops, fixed once at plan time.
        progress: Counts and the checkpoint.
        evidence: At most one entry per kind.
        next_actions: What an operator or orchestrator does next.
        snapshot_label: One snapshot or several, reconciled or not.
        linked_authority_remains_authoritative: Always true: the source stays the authority.
        candidate_authoritative: Always false: the target never claims authority.
        effects: What the run did.
    """

    protocol: str = BACKFILL_PROTOCOL
    run_id: str
    run_digest: str = ""
    revision: Ordinal
    status: BackfillStatus
    scope: BackfillScope
    boundary: Boundary
    progress: BackfillProgress
    evidence: tuple[BackfillEvidence, ...] = ()
    next_actions: tuple[str, ...] = ()
    snapshot_label: SnapshotLabel = SnapshotLabel.NO_ROWS_COPIED
    linked_authority_remains_authoritative: bool = True
    candidate_authoritative: bool = False
    effects: BackfillEffects = BackfillEffects()


class BatchRequest(Document):
    """The slice of the source one batch copies, fixed before any row is read.

    Its digest identifies the batch's intent: replaying the same batch id with the same digest
    (a lost commit acknowledgement) returns the stored receipt without touching the source.

    Attributes:
        run_id: The run.
        batch_id: ``<sequence, zero-padded>``: ordered and deterministic per run.
        sequence: 1 for the first batch.
        expected_checkpoint: The durable checkpoint this batch builds on.
        after: Rows strictly after this cursor value (``None``: from the scope's start).
        batch_size: At most this many rows, plus any rows tied on the last cursor value.
        source_high_water_mark: At most this cursor value.
    """

    run_id: str
    batch_id: str = Field(min_length=1)
    sequence: Ordinal
    expected_checkpoint: str | None
    after: str | None
    batch_size: Ordinal
    source_high_water_mark: str | None


class ApplyPath(StrEnum):
    """How the batch reached the target table."""

    DIRECT = "direct_copy"
    """Binary COPY straight into the target inside a savepoint (no row of the batch existed)."""
    STAGED = "staged_apply"
    """COPY into a temporary staging table, then set-based insert/compare (rows existed)."""
    NONE = "no_rows"


class BatchObservation(Document):
    """What the copier saw while moving one batch (input to the pure apply rule).

    Attributes:
        upper: The batch covers ``(after, upper]`` in cursor order.
        first_cursor: The smallest cursor value copied.
        last_cursor: The largest cursor value copied.
        source_count: ``count(*)`` of the range, read inside the batch's snapshot.
        copy_out_count: The source's ``COPY ... TO STDOUT`` command-tag count.
        copy_in_count: The target's ``COPY ... FROM STDIN`` command-tag count.
        target_count: Rows of the range in the target after apply: counted by the target, or,
            after a direct COPY into a range the target held no row of when the batch began
            (an index probe) and a table without user triggers, the target's COPY command tag
            (those rows are then the only rows of the range).
        copied_count: Rows inserted.
        duplicate_count: Rows already present and equal.
        content_hash: ``sha256:`` of the batch's COPY stream (rows in cursor, key order).
        byte_count: Bytes relayed.
        final: No row of the scope remains after ``upper`` up to the mark.
        apply_path: Direct COPY or staged apply.
        extraction: The batch's lifecycle receipt (window, clock, snapshot token digest).
        row_versions: Evidence for the reconciliation's row-version proof, when it applies
            (taken only for a batch COPYed straight into a target without user triggers).
    """

    upper: str | None
    first_cursor: str | None
    last_cursor: str | None
    source_count: Count
    copy_out_count: Count
    copy_in_count: Count
    target_count: Count
    copied_count: Count
    duplicate_count: Count
    content_hash: str
    byte_count: Count
    final: bool
    apply_path: ApplyPath
    extraction: ExtractionLifecycleReceipt
    row_versions: RowVersionEvidence | None = None


class BatchReceipt(Document):
    """The durable proof of one committed batch: a link of the checkpoint chain.

    Attributes:
        run_id: The run.
        batch_id: The request's batch id.
        sequence: The request's sequence.
        batch_digest: The request's digest.
        previous_checkpoint: The checkpoint this batch built on (``None`` for the first).
        checkpoint: Digest over the run id, previous checkpoint, batch digest and observation.
        after: The exclusive lower cursor bound of the batch's range.
        observation: Counts, cursor values, content hash and the extraction receipt.
        source_high_water_mark: The mark the batch was bounded by.
        source_authority_unchanged: Always true: the source was only read.
        candidate_authoritative: Always false.
    """

    run_id: str
    batch_id: str
    sequence: Ordinal
    batch_digest: str
    previous_checkpoint: str | None
    checkpoint: str
    after: str | None
    observation: BatchObservation
    source_high_water_mark: str | None
    source_authority_unchanged: bool = True
    candidate_authoritative: bool = False

    @property
    def copied_count(self) -> int:
        """Rows this batch inserted."""
        return self.observation.copied_count

    @property
    def duplicate_count(self) -> int:
        """Rows this batch found present and equal."""
        return self.observation.duplicate_count
