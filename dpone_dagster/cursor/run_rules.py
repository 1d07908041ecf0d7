"""The backfill state machine: pure functions from one document to the next (no I/O).

A run is accepted only with a valid digest and without claims it may not make; a batch builds
on exactly the durable checkpoint; batches advance strictly in cursor order (numbers compare as
numbers, timestamps as instants; the named rules of :mod:`.batch_rules`); a committed batch id
replayed with the same digest returns the stored receipt, with another digest it is refused;
and every receipt's checkpoint is a digest over the previous checkpoint, so the receipts form a
chain that :func:`.chain.verify_chain` checks end to end.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from dpone_dagster.core.errors import engine_error
from dpone_dagster.lifecycle import SnapshotLabel

from .backfill_documents import (
    BACKFILL_PROTOCOL,
    BackfillEffects,
    BackfillEvidence,
    BackfillProgress,
    BackfillRun,
    BackfillScope,
    BackfillStatus,
    BatchObservation,
    BatchReceipt,
    BatchRequest,
    Boundary,
    MissingBoundary,
)
from .batch_rules import check_observation
from .cursor_sql import cursor_is_strictly_before


def digest(value: BaseModel | Any) -> str:
    """``sha256:<hex>`` of the canonical JSON of a model or a JSON-ready value."""
    data = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _sealed(run: BackfillRun) -> BackfillRun:
    return run.model_copy(update={"run_digest": run_digest(run)})


def run_digest(run: BackfillRun) -> str:
    """The digest of every field of ``run`` except ``run_digest`` itself."""
    return digest(run.model_dump(mode="json", exclude={"run_digest"}))


def run_id_for(scope: BackfillScope) -> str:
    """``backfill:<scope digest>``: the same scope always names the same run."""
    return "backfill:" + digest(scope).removeprefix("sha256:")[:32]


def run_integrity_is_valid(run: BackfillRun) -> bool:
    """The integrity rule: protocol, no authority claims, no source effects, digest."""
    hwm = getattr(run.boundary, "source_high_water_mark", None)
    return (
        run.protocol == BACKFILL_PROTOCOL
        and run.linked_authority_remains_authoritative
        and not run.candidate_authoritative
        and not run.effects.mutates_source_data
        and not run.effects.changes_authority
        and not run.effects.emits_business_effects
        and not isinstance(run.boundary, MissingBoundary)
        and run.progress.source_high_water_mark == hwm
        and len({e.kind for e in run.evidence}) == len(run.evidence)
        and run.run_digest == run_digest(run)
    )


def require_valid(run: BackfillRun) -> None:
    """Raises ``backfill_run_invalid`` unless ``run`` passes :func:`run_integrity_is_valid`."""
    if not run_integrity_is_valid(run):
        raise engine_error("backfill_run_invalid", f"Run {run.run_id} does not verify.")


def with_evidence(
    evidence: Sequence[BackfillEvidence], new: BackfillEvidence
) -> tuple[BackfillEvidence, ...]:
    """Replaces the entry of ``new.kind`` (one per kind keeps the run O(1))."""
    return (*(e for e in evidence if e.kind != new.kind), new)


def start_run(
    scope: BackfillScope,
    boundary: Boundary,
    *,
    rows_at_boundary: int,
    boundary_evidence: BackfillEvidence,
    planned: Sequence[BackfillEvidence] = (),
) -> BackfillRun:
    """Creates the planned run for ``scope`` bounded by ``boundary``, with the boundary's
    evidence and what else the plan chose (``planned``: its batch size).

    Raises:
        EngineError: ``backfill_cursor_missing`` for a missing boundary or an empty mark,
            ``plan_invalid`` for a boundary whose cursor is not the scope's, or a partition
            range whose lower bound is not below its upper bound.
    """
    if isinstance(boundary, MissingBoundary):
        raise engine_error("backfill_cursor_missing")
    if boundary.source_high_water_mark == "":
        raise engine_error(
            "backfill_cursor_missing",
            "The source high-water mark must not be empty.",
            ["Capture a durable source high-water mark before copying data."],
        )
    if boundary.cursor != scope.cursor:
        raise engine_error(
            "plan_invalid", f"The boundary's cursor {boundary.cursor!r} is not {scope.cursor!r}."
        )
    if (
        scope.lower is not None
        and scope.upper is not None
        and not cursor_is_strictly_before(scope.lower, scope.upper)
    ):
        raise engine_error("plan_invalid", f"The range ({scope.lower}, {scope.upper}] is empty.")
    hwm = boundary.source_high_water_mark
    run = BackfillRun(
        run_id=run_id_for(scope),
        revision=1,
        status=BackfillStatus.PLANNED,
        scope=scope,
        boundary=boundary,
        progress=BackfillProgress(
            source_high_water_mark=hwm,
            rows_at_boundary=rows_at_boundary,
            remaining_estimate=rows_at_boundary,
            next_after=scope.lower,
        ),
        evidence=(boundary_evidence, *planned),
        next_actions=("Copy the next ordered batch and commit it with its receipt.",),
    )
    return _sealed(run)


def next_request(run: BackfillRun, batch_size: int) -> BatchRequest:
    """The request for the batch after the run's durable checkpoint."""
    sequence = run.progress.batch_count + 1
    return BatchRequest(
        run_id=run.run_id,
        batch_id=f"{sequence:09d}",
        sequence=sequence,
        expected_checkpoint=run.progress.checkpoint,
        after=run.progress.next_after,
        batch_size=batch_size,
        source_high_water_mark=run.progress.source_high_water_mark,
    )


def replay(request: BatchRequest, stored: BatchReceipt | None) -> BatchReceipt | None:
    """Answers a request whose batch id is already committed.

    Returns:
        The stored receipt when the digests match (a lost response, answered by replay), or
        ``None`` when the batch id is new.

    Raises:
        EngineError: ``backfill_batch_changed`` when the id was committed with another digest.
    """
    if stored is None:
        return None
    if stored.batch_digest != digest(request):
        raise engine_error(
            "backfill_batch_changed", f"Batch {request.batch_id} of {request.run_id}."
        )
    return stored


def check_request(run: BackfillRun, request: BatchRequest) -> None:
    """Refuses a request that does not build on the run's durable state.

    Raises:
        EngineError: ``backfill_run_invalid`` for a run that does not verify, belongs to
            another run id or is blocked; ``backfill_checkpoint_stale`` for another expected
            checkpoint; ``backfill_batch_unordered`` for a request that does not start at the
            run's position or follows the final batch.
    """
    require_valid(run)
    if request.run_id != run.run_id:
        raise engine_error("backfill_run_invalid", "The request belongs to another run.")
    if run.status is BackfillStatus.BLOCKED:
        raise engine_error("backfill_run_invalid", "The run is blocked; see its next actions.")
    if request.expected_checkpoint != run.progress.checkpoint:
        raise engine_error(
            "backfill_checkpoint_stale",
            f"Expected {request.expected_checkpoint}, durable {run.progress.checkpoint}.",
        )
    if run.status is BackfillStatus.SUCCEEDED:
        raise engine_error("backfill_batch_unordered", "No batch follows the final batch.")
    p = run.progress
    position = {
        "sequence": (request.sequence, p.batch_count + 1),
        "lower bound (after)": (request.after, p.next_after),
        "high-water mark": (request.source_high_water_mark, p.source_high_water_mark),
    }
    for name, (asked, durable) in position.items():
        if asked != durable:
            raise engine_error(
                "backfill_batch_unordered",
                f"Batch {request.batch_id} does not start at the durable position: its {name} "
                f"is {asked!r}, the run's next is {durable!r}.",
            )


def checkpoint_for(
    run_id: str, previous: str | None, batch_digest: str, seen: BatchObservation
) -> str:
    """The next link of the chain: binds the previous link, the request and what was copied."""
    return digest([run_id, previous, batch_digest, seen.model_dump(mode="json")])


def apply_batch(
    run: BackfillRun, request: BatchRequest, seen: BatchObservation
) -> tuple[BackfillRun, BatchReceipt]:
    """The run after ``request`` was copied as ``seen`` describes, and the batch's receipt.

    Raises:
        EngineError: everything :func:`check_request` raises, and the code of the first rule
            of :data:`.batch_rules.BATCH_RULES` the batch breaks (``backfill_batch_unordered``,
            ``backfill_record_changed`` or ``backfill_run_invalid``), naming the rule.
    """
    check_request(run, request)
    check_observation(request, seen)
    receipt = _receipt(run, request, seen)
    effects = BackfillEffects(
        reads_scoped_source_data=True,
        copies_target_data=run.effects.copies_target_data or seen.copied_count > 0,
    )
    new_run = run.model_copy(
        update={
            "revision": run.revision + 1,
            "status": BackfillStatus.SUCCEEDED if seen.final else BackfillStatus.IN_PROGRESS,
            "progress": _progress_after(run.progress, receipt),
            "evidence": with_evidence(run.evidence, _receipt_evidence(receipt)),
            "next_actions": (
                ("Reconcile the target against the source at the high-water mark.",)
                if seen.final
                else ("Copy the next ordered batch after progress.next_after.",)
            ),
            "snapshot_label": _label_after(run.snapshot_label, seen),
            "effects": effects,
        }
    )
    return _sealed(new_run), receipt


def _receipt(run: BackfillRun, request: BatchRequest, seen: BatchObservation) -> BatchReceipt:
    """The batch's receipt: the next link of the run's checkpoint chain."""
    batch_digest = digest(request)
    return BatchReceipt(
        run_id=run.run_id,
        batch_id=request.batch_id,
        sequence=request.sequence,
        batch_digest=batch_digest,
        previous_checkpoint=run.progress.checkpoint,
        checkpoint=checkpoint_for(run.run_id, run.progress.checkpoint, batch_digest, seen),
        after=request.after,
        observation=seen,
        source_high_water_mark=request.source_high_water_mark,
    )


def _progress_after(p: BackfillProgress, receipt: BatchReceipt) -> BackfillProgress:
    """The run's position once ``receipt``'s batch is committed."""
    seen = receipt.observation
    copied = p.copied_count + seen.copied_count
    duplicates = p.duplicate_count + seen.duplicate_count
    return p.model_copy(
        update={
            "batch_count": receipt.sequence,
            "copied_count": copied,
            "duplicate_count": duplicates,
            "remaining_estimate": max(0, p.rows_at_boundary - copied - duplicates),
            "checkpoint": receipt.checkpoint,
            "next_after": seen.upper if seen.upper is not None else p.next_after,
        }
    )


def _receipt_evidence(receipt: BatchReceipt) -> BackfillEvidence:
    seen = receipt.observation
    return BackfillEvidence(
        kind="last_batch_receipt",
        subject=receipt.batch_id,
        digest=receipt.batch_digest,
        detail=f"Copied {seen.copied_count} rows and found {seen.duplicate_count} already "
        f"present, up to cursor {seen.upper!r}.",
    )


def _label_after(label: SnapshotLabel, seen: BatchObservation) -> SnapshotLabel:
    """One snapshot once a batch copied rows, several from the second such batch on."""
    if not seen.source_count:
        return label
    if label is SnapshotLabel.NO_ROWS_COPIED:
        return SnapshotLabel.SINGLE_SNAPSHOT
    return SnapshotLabel.SEVERAL_SNAPSHOTS


def revise(run: BackfillRun, **changes: Any) -> BackfillRun:
    """A new revision of ``run`` with ``changes`` (status, evidence, label...), resealed."""
    require_valid(run)
    return _sealed(run.model_copy(update={**changes, "revision": run.revision + 1}))
