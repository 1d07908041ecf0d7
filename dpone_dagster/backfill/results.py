"""What a backfill call returns: the result of :meth:`Backfill.run`, and the run after a
reconciliation."""

from __future__ import annotations

from dataclasses import dataclass

from dpone_dagster.core.errors import RECORD_CHANGED_ACTIONS, EngineError
from dpone_dagster.cursor.backfill_documents import BackfillEvidence, BackfillRun, BackfillStatus
from dpone_dagster.cursor.range_checks import RangeOutcome, ReconciliationReport
from dpone_dagster.cursor.run_rules import digest, revise, with_evidence
from dpone_dagster.lifecycle import SnapshotLabel


class BackfillReconciliationError(EngineError):
    """The final reconciliation left ranges that differ; :attr:`report` lists them."""

    def __init__(self, report: ReconciliationReport) -> None:
        bad = report.differing
        super().__init__(
            "backfill_record_changed",
            f"{len(bad)} batch range(s) of {report.run_id} differ from the source after repair "
            f"(first: batch {bad[0].sequence}, {bad[0].detail})",
            RECORD_CHANGED_ACTIONS,
        )
        self.report = report


@dataclass(frozen=True)
class BackfillResult:
    """What :meth:`Backfill.run` did.

    Attributes:
        run: The durable run at the end.
        committed: Batches this call committed.
        replayed: Batches answered by replay (committed earlier; the response had been lost).
        reconciliation: The final reconciliation, when the run reached its mark.
    """

    run: BackfillRun
    committed: int
    replayed: int
    reconciliation: ReconciliationReport | None

    @property
    def snapshot_label(self) -> SnapshotLabel:
        """One snapshot or several, reconciled or not."""
        return self.run.snapshot_label


def _label_after(run: BackfillRun, report: ReconciliationReport) -> SnapshotLabel:
    """The run's label after ``report``: a rewrite from the reconciliation's snapshot says so
    for good; otherwise several batch snapshots are reconciled only when every range is equal."""
    label = run.snapshot_label
    if report.ok and (report.rewritten or label is SnapshotLabel.REPAIRED_TO_ONE_SNAPSHOT):
        return SnapshotLabel.REPAIRED_TO_ONE_SNAPSHOT
    if label in (
        SnapshotLabel.SEVERAL_SNAPSHOTS,
        SnapshotLabel.SEVERAL_SNAPSHOTS_RECONCILED,
        SnapshotLabel.REPAIRED_TO_ONE_SNAPSHOT,
    ):
        return (
            SnapshotLabel.SEVERAL_SNAPSHOTS_RECONCILED
            if report.ok
            else SnapshotLabel.SEVERAL_SNAPSHOTS
        )
    return label


def after_reconcile(run: BackfillRun, report: ReconciliationReport) -> BackfillRun:
    """The run after its reconciliation: ``succeeded`` or ``blocked``, its label, and the
    reconciliation's evidence (the source snapshot's digest, outcomes and rows repaired)."""
    counts = {o.value: report.count(o) for o in RangeOutcome}
    evidence = BackfillEvidence(
        kind="reconciliation",
        subject=report.source_snapshot,
        digest=digest(report),
        detail=(
            f"{len(report.ranges)} batch ranges under one source snapshot: {counts}; "
            f"rows repaired: {report.repaired_rows()}."
        ),
    )
    return revise(
        run,
        status=BackfillStatus.SUCCEEDED if report.ok else BackfillStatus.BLOCKED,
        snapshot_label=_label_after(run, report),
        evidence=with_evidence(run.evidence, evidence),
        next_actions=(
            ("Nothing left: the target equals the source at the mark.",)
            if report.ok
            else RECORD_CHANGED_ACTIONS
        ),
    )


def needs_reconciliation(run: BackfillRun) -> bool:
    """At the mark and not yet reconciled, or blocked by an earlier reconciliation."""
    if run.status is BackfillStatus.BLOCKED:
        return True
    reconciled = any(e.kind == "reconciliation" for e in run.evidence)
    return run.status is BackfillStatus.SUCCEEDED and not reconciled
