"""The fixed mark's reconciliation documents (pure): one check per batch range, and the report
(the ledger keeps each check: :meth:`.cursor_ledger.RunLedger.record_checks`)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from dpone_dagster.core.documents import Count, Document, Ordinal
from dpone_dagster.core.errors import EngineError
from dpone_dagster.lifecycle import Vocabulary
from dpone_dagster.reconcile import Proof


class OnChanged(Vocabulary, option="on_changed", refusal="plan_invalid", error=EngineError):
    """What the final reconciliation does with a row the source changed or deleted after its
    batch was copied (the one on-changed vocabulary)."""

    FAIL = "fail"
    """Keep the copied history and report the range with ``backfill_record_changed``."""
    REPAIR = "repair"
    """Rewrite the range from the reconciliation's one source snapshot (changed rows updated,
    deleted rows deleted, missing rows inserted)."""


class RangeOutcome(StrEnum):
    """What a reconciliation found for one batch range."""

    EQUAL = "equal"
    REPAIRED = "repaired"
    """Rows missing from the target were copied (and, with ``on_changed="repair"``, changed rows
    rewritten and deleted rows removed); the range is now equal."""
    DIFFERS = "differs"
    """Still different after repair; ``code`` says why. Never silently accepted."""


class RangeCheck(Document):
    """Source and target compared over one batch range ``(after, upper]``.

    Attributes:
        sequence: The batch whose range this is.
        after: Exclusive lower cursor bound.
        upper: Inclusive upper cursor bound.
        source_count: Rows of the range in the source (reconciliation snapshot).
        target_count: Rows of the range in the target, after any repair.
        source_hash: The source range's content hash: its ``rowhash64-sum:`` digest, or, when
            proven by row versions, the receipt's hash of the batch's COPY stream.
        target_hash: The same over the target, after any repair.
        receipt_hash: The batch receipt's content hash (the source range when copied).
        proof: How equality was established: row versions, or the content hash of both sides.
        inserted: Rows copied by the repair.
        updated: Rows the repair rewrote (changed in the source after their batch).
        deleted: Rows the repair deleted (gone from the source's range after their batch).
        outcome: equal, repaired or differs.
        code: The error code of a difference (``backfill_record_changed``).
        detail: What differs, in words.
    """

    sequence: Ordinal
    after: str | None
    upper: str | None
    source_count: Count
    target_count: Count
    source_hash: str
    target_hash: str
    receipt_hash: str
    proof: Proof = Proof.CONTENT_HASH
    inserted: Count = 0
    updated: Count = 0
    deleted: Count = 0
    outcome: RangeOutcome
    code: str | None = None
    detail: str = ""


class ReconciliationReport(Document):
    """The final reconciliation of a run at its high-water mark.

    Attributes:
        run_id: The run.
        source_snapshot: Digest of the ONE source snapshot every range was read under.
        target_snapshot: Digest of the ONE target snapshot the ranges were first read under.
        proved_at: When that source snapshot was taken (the source server's clock): the point
            in time at which an ``ok`` report proves the target equal to the source.
        ranges: One check per batch range, in cursor order.
    """

    run_id: str
    source_snapshot: str
    target_snapshot: str
    proved_at: datetime
    ranges: tuple[RangeCheck, ...]

    @property
    def ok(self) -> bool:
        """True when no range differs."""
        return all(r.outcome is not RangeOutcome.DIFFERS for r in self.ranges)

    @property
    def differing(self) -> tuple[RangeCheck, ...]:
        """The ranges that still differ."""
        return tuple(r for r in self.ranges if r.outcome is RangeOutcome.DIFFERS)

    def count(self, outcome: RangeOutcome) -> int:
        """How many ranges ended with ``outcome``."""
        return sum(1 for r in self.ranges if r.outcome is outcome)

    @property
    def rewritten(self) -> bool:
        """True when a repair updated or deleted rows: the target then shows the source at the
        reconciliation's snapshot, not at the batches' snapshots."""
        return any(r.updated or r.deleted for r in self.ranges)

    def repaired_rows(self) -> dict[str, int]:
        """Rows the repairs inserted, updated and deleted, over every range."""
        return {
            "inserted": sum(r.inserted for r in self.ranges),
            "updated": sum(r.updated for r in self.ranges),
            "deleted": sum(r.deleted for r in self.ranges),
        }

    def proven_by(self, proof: Proof) -> int:
        """How many ranges were established by ``proof``."""
        return sum(1 for r in self.ranges if r.proof is proof)
