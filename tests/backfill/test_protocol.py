"""The pure protocol: integrity rules, the checkpoint chain, replay, ordering, O(1) runs."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from dpone_dagster.backfill import (
    ApplyPath,
    BackfillEvidence,
    BackfillRun,
    BackfillScope,
    BackfillStatus,
    BatchObservation,
    BatchRequest,
    MissingBoundary,
    TableRef,
    TrustworthyCursor,
)
from dpone_dagster.core import ENGINE_ERRORS, EngineError
from dpone_dagster.cursor.batch_rules import BATCH_RULES
from dpone_dagster.cursor.chain import verify_chain
from dpone_dagster.cursor.run_rules import (
    apply_batch,
    cursor_is_strictly_before,
    digest,
    next_request,
    replay,
    revise,
    run_integrity_is_valid,
    start_run,
)
from dpone_dagster.lifecycle import ExtractionLifecycleAuthority, SnapshotEvidence

T0 = datetime(2024, 1, 1, tzinfo=UTC)
CLOCK = "postgresql.clock_timestamp"


def scope(lower: str | None = None, upper: str | None = None) -> BackfillScope:
    return BackfillScope(
        source=TableRef(database="src", schema_name="public", name="orders"),
        target=TableRef(database="dst", schema_name="public", name="orders"),
        cursor="id",
        cursor_type="bigint",
        key=("id",),
        columns=("id", "amount"),
        lower=lower,
        upper=upper,
    )


def new_run(hwm: str | None = "1000000", rows: int = 1_000_000, **kw: str | None) -> BackfillRun:
    evidence = BackfillEvidence(kind="source_boundary", subject=str(hwm), digest="d", detail="")
    return start_run(
        scope(**kw),
        TrustworthyCursor(cursor="id", source_high_water_mark=hwm),
        rows_at_boundary=rows,
        boundary_evidence=evidence,
    )


def observe(
    after: str | None, upper: str, count: int, *, final: bool = False, copied: int | None = None
) -> BatchObservation:
    authority = ExtractionLifecycleAuthority()
    authority.acquire(started_at=T0, clock_authority=CLOCK)
    authority.acquire_snapshot(
        SnapshotEvidence(authority="pg", token="1:2:", acquired_at=T0, clock_authority=CLOCK)
    )
    receipt = authority.complete(row_count=count, byte_count=count * 10, completed_at=T0)
    first = str(int(after or 0) + 1) if count else None
    copied = count if copied is None else copied
    return BatchObservation(
        upper=upper,
        first_cursor=first,
        last_cursor=upper if count else None,
        source_count=count,
        copy_out_count=count,
        copy_in_count=count,
        target_count=count,
        copied_count=copied,
        duplicate_count=count - copied,
        content_hash=f"h{upper}",
        byte_count=count * 10,
        final=final,
        apply_path=ApplyPath.DIRECT,
        extraction=receipt,
    )


def advance(run: BackfillRun, rows: int, *, final: bool = False) -> BackfillRun:
    request = next_request(run, rows)
    after = int(request.after or 0)
    run, _ = apply_batch(run, request, observe(request.after, str(after + rows), rows, final=final))
    return run


def code_of(exc: pytest.ExceptionInfo[EngineError]) -> str:
    assert exc.value.message and exc.value.next_actions
    return exc.value.code


def test_a_missing_boundary_or_empty_mark_is_refused_with_backfill_cursor_missing() -> None:
    with pytest.raises(EngineError) as missing:
        start_run(
            scope(),
            MissingBoundary(),
            rows_at_boundary=0,
            boundary_evidence=BackfillEvidence(kind="k", subject="", digest="", detail=""),
        )
    assert code_of(missing) == "backfill_cursor_missing"
    with pytest.raises(EngineError) as empty:
        new_run(hwm="")
    assert code_of(empty) == "backfill_cursor_missing"


def test_an_empty_partition_range_is_plan_invalid() -> None:
    with pytest.raises(EngineError) as err:
        new_run(lower="10", upper="9")
    assert code_of(err) == "plan_invalid"


def test_batches_form_a_verifiable_checkpoint_chain_and_the_run_succeeds_at_the_mark() -> None:
    run = new_run(hwm="300", rows=300)
    receipts = []
    for i in range(3):
        request = next_request(run, 100)
        run, receipt = apply_batch(
            run, request, observe(request.after, str(100 * (i + 1)), 100, final=i == 2)
        )
        receipts.append(receipt)
    assert run.status is BackfillStatus.SUCCEEDED
    assert run.progress.copied_count == 300 and run.progress.remaining_estimate == 0
    assert receipts[1].previous_checkpoint == receipts[0].checkpoint
    verify_chain(run, receipts)
    forged = receipts[1].model_copy(update={"observation": observe("100", "200", 100, copied=99)})
    with pytest.raises(EngineError) as err:
        verify_chain(run, [receipts[0], forged, receipts[2]])
    assert code_of(err) == "backfill_run_invalid"


def test_replay_returns_the_stored_receipt_and_a_changed_batch_is_refused() -> None:
    run = new_run()
    request = next_request(run, 100)
    _, receipt = apply_batch(run, request, observe(None, "100", 100))
    assert replay(request, receipt) == receipt
    assert replay(request, None) is None
    changed = request.model_copy(update={"batch_size": 200})
    with pytest.raises(EngineError) as err:
        replay(changed, receipt)
    assert code_of(err) == "backfill_batch_changed"


def test_a_stale_expected_checkpoint_is_refused() -> None:
    run = new_run()
    old_request = next_request(run, 100)
    run = advance(run, 100)
    stale = old_request.model_copy(update={"batch_id": "x", "sequence": 2})
    with pytest.raises(EngineError) as err:
        apply_batch(run, stale, observe("100", "200", 100))
    assert code_of(err) == "backfill_checkpoint_stale"


@pytest.mark.parametrize(
    ("after", "upper", "first"),
    [("100", "200", "100"), ("100", "2000000", "101"), ("100", "100", "101")],
    ids=["not-after-checkpoint", "beyond-the-mark", "upper-not-after"],
)
def test_rows_not_strictly_after_the_checkpoint_or_beyond_the_mark_are_unordered(
    after: str, upper: str, first: str
) -> None:
    run = advance(new_run(), 100)
    request = next_request(run, 100)
    seen = observe(after, upper, 100).model_copy(update={"first_cursor": first})
    with pytest.raises(EngineError) as err:
        apply_batch(run, request, seen)
    assert code_of(err) == "backfill_batch_unordered"


def _break(rule: str) -> tuple[BackfillRun, BatchRequest, BatchObservation]:
    """A run, its next request and an observation that breaks ``rule`` and no other rule."""
    if rule == "upper bound strictly after the checkpoint":  # only possible with no rows
        run = new_run(hwm="100", rows=0, lower="100")
        return run, next_request(run, 100), observe("100", "100", 0, final=True)
    run = advance(new_run(), 100)  # the next batch is after "100"; the mark is "1000000"
    request = next_request(run, 100)
    valid = observe("100", "200", 100)  # rows "101".."200" up to "200"
    changes: dict[str, object] = {
        "first and last cursors are set exactly when the batch has rows": {"last_cursor": None},
        "first cursor not after the last cursor": {"first_cursor": "150", "last_cursor": "120"},
        "first cursor strictly after the checkpoint": {"first_cursor": "100"},
        "last cursor within the batch's upper bound": {"last_cursor": "250"},
        "upper bound within the mark": {"upper": "2000000"},
        "the final batch ends at the mark": {"final": True},
        "a non-final batch has rows and stops before the mark": {
            "upper": "1000000",
            "last_cursor": "1000000",
        },
        "the snapshot's count, both COPY tags, the target's count and copied + duplicates agree": {
            "target_count": 99
        },
        "the extraction receipt is a completed snapshot read of the copied rows": {
            "extraction": observe("100", "200", 99).extraction
        },
    }[rule]
    return run, request, valid.model_copy(update=changes)


UNORDERED = "backfill_batch_unordered"
RULES = [
    ("first and last cursors are set exactly when the batch has rows", UNORDERED),
    ("first cursor not after the last cursor", UNORDERED),
    ("first cursor strictly after the checkpoint", UNORDERED),
    ("last cursor within the batch's upper bound", UNORDERED),
    ("upper bound strictly after the checkpoint", UNORDERED),
    ("upper bound within the mark", UNORDERED),
    ("the final batch ends at the mark", UNORDERED),
    ("a non-final batch has rows and stops before the mark", UNORDERED),
    (
        "the snapshot's count, both COPY tags, the target's count and copied + duplicates agree",
        "backfill_record_changed",
    ),
    (
        "the extraction receipt is a completed snapshot read of the copied rows",
        "backfill_run_invalid",
    ),
]


@pytest.mark.parametrize(("rule", "code"), RULES, ids=[r for r, _ in RULES])
def test_a_batch_that_breaks_one_rule_is_refused_naming_that_rule(rule: str, code: str) -> None:
    run, request, seen = _break(rule)
    assert [r.name for r in BATCH_RULES if not r.holds(request, seen)] == [rule]  # this one alone
    with pytest.raises(EngineError) as err:
        apply_batch(run, request, seen)
    assert code_of(err) == code
    assert f'breaks the rule "{rule}"' in err.value.message, err.value.message


def test_every_batch_rule_is_broken_alone_above() -> None:
    assert [(r.name, r.code) for r in BATCH_RULES] == RULES


def test_no_batch_follows_the_final_batch_and_a_skipped_sequence_is_unordered() -> None:
    run = advance(new_run(hwm="100", rows=100), 100, final=True)
    with pytest.raises(EngineError) as err:
        apply_batch(run, next_request(run, 100), observe("100", "100", 0, final=True))
    assert code_of(err) == "backfill_batch_unordered"
    fresh = new_run()
    skipped = next_request(fresh, 100).model_copy(update={"sequence": 5})
    with pytest.raises(EngineError) as err2:
        apply_batch(fresh, skipped, observe(None, "100", 100))
    assert code_of(err2) == "backfill_batch_unordered"
    assert "its sequence is 5, the run's next is 1" in err2.value.message


def test_counts_that_disagree_are_backfill_record_changed() -> None:
    run = new_run()
    seen = observe(None, "100", 100).model_copy(update={"target_count": 99})
    with pytest.raises(EngineError) as err:
        apply_batch(run, next_request(run, 100), seen)
    assert code_of(err) == "backfill_record_changed"


def test_a_tampered_or_authority_claiming_run_is_invalid() -> None:
    run = new_run()
    assert run_integrity_is_valid(run)
    tampered = run.model_copy(
        update={"progress": run.progress.model_copy(update={"copied_count": 5})}
    )
    claiming = run.model_copy(update={"candidate_authoritative": True})
    for bad in (tampered, claiming):
        assert not run_integrity_is_valid(bad)
        with pytest.raises(EngineError) as err:
            apply_batch(bad, next_request(bad, 100), observe(None, "100", 100))
        assert code_of(err) == "backfill_run_invalid"


def test_cursor_order_is_numeric_and_temporal_not_textual() -> None:
    assert cursor_is_strictly_before("9", "10")
    assert cursor_is_strictly_before("-5", "3")
    assert cursor_is_strictly_before("1.5", "1.25") is False
    assert cursor_is_strictly_before("2024-01-01 23:00:00+00", "2024-01-02 00:00:00+01") is False
    assert cursor_is_strictly_before("2024-01-01 09:00:00", "2024-01-01 10:00:00")


def test_the_run_document_stays_the_same_size_after_10_and_after_1000_batches() -> None:
    run = new_run(hwm="9999999", rows=9_999_999)
    sizes = {}
    for n in range(1, 1001):
        run = advance(run, 1000 if n <= 10 else 10)
        if n in (10, 1000):
            sizes[n] = run.model_dump_json()
    small, large = json.loads(sizes[10]), json.loads(sizes[1000])
    assert len(small["evidence"]) == len(large["evidence"]) == 2
    assert small.keys() == large.keys()
    assert abs(len(sizes[10]) - len(sizes[1000])) <= 8, (len(sizes[10]), len(sizes[1000]))


def test_revise_bumps_the_revision_and_reseals() -> None:
    run = new_run()
    blocked = revise(run, status=BackfillStatus.BLOCKED)
    assert blocked.revision == run.revision + 1 and run_integrity_is_valid(blocked)
    assert (
        blocked.run_digest
        != run.run_digest
        == digest(run.model_dump(mode="json", exclude={"run_digest"}))
    )


def test_every_error_code_has_a_message_and_next_actions() -> None:
    seed = {
        "plan_invalid",
        "destination_expansion_incomplete",
        "backfill_cursor_missing",
        "backfill_batch_unordered",
        "backfill_checkpoint_stale",
        "backfill_batch_changed",
        "backfill_record_changed",
        "backfill_run_invalid",
        "backfill_persistence_failed",
    }
    assert seed <= set(ENGINE_ERRORS)
    for message, actions in ENGINE_ERRORS.values():
        assert message.endswith(".") and actions


def test_the_json_schema_export_names_every_document() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dpone_dagster.backfill.schema"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    defs = json.loads(out)["$defs"]
    for name in (
        "BackfillRun",
        "BatchReceipt",
        "BatchRequest",
        "TrustworthyCursor",
        "BoundedWritePause",
        "MissingBoundary",
        "ReconciliationReport",
    ):
        assert name in defs
    assert "ExtractionLifecycleReceipt" in defs


def test_batch_requests_are_deterministic() -> None:
    run = new_run()
    assert next_request(run, 10) == next_request(run, 10)
    assert digest(next_request(run, 10)) != digest(next_request(run, 11))
    assert isinstance(next_request(run, 10), BatchRequest)
