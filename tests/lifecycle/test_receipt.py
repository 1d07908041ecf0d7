"""Receipt semantics: immutability, atomic replacement, honest timing and snapshot evidence."""

from __future__ import annotations

import sys
import threading
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from dpone_dagster.lifecycle import (
    ORCHESTRATOR_UTC,
    ExtractionLifecycleAuthority,
    ExtractionLifecycleReceipt,
    LifecycleError,
    ReceiptState,
    SnapshotEvidence,
    token_digest,
)

PG_CLOCK = "postgresql.clock_timestamp"
RAW_TOKEN = "00000003-0000001B-1"


def evidence(at: datetime) -> SnapshotEvidence:
    return SnapshotEvidence(
        authority="postgresql.pg_export_snapshot",
        token=RAW_TOKEN,
        acquired_at=at,
        clock_authority=PG_CLOCK,
    )


def test_a_new_authority_hands_out_a_pending_receipt() -> None:
    receipt = ExtractionLifecycleAuthority().receipt
    assert receipt.state is ReceiptState.PENDING
    assert receipt.extraction_started_at is None
    assert receipt.extraction_completed_at is None
    assert receipt.clock_authority == ORCHESTRATOR_UTC == "dpone.orchestrator.utc"
    assert receipt.snapshot_authority is None and receipt.source_token is None


def test_receipts_are_immutable() -> None:
    authority = ExtractionLifecycleAuthority()
    receipt = authority.acquire()
    with pytest.raises(ValidationError):
        receipt.extraction_completed_at = datetime.now(UTC)  # type: ignore[misc]
    with pytest.raises(ValidationError):
        receipt.row_count = 5  # type: ignore[misc]
    before = receipt.model_dump()
    authority.complete(row_count=5)
    assert receipt.model_dump() == before, "a published receipt must never change"
    assert authority.receipt is not receipt


def test_completion_stays_null_until_complete_and_then_carries_counts() -> None:
    authority = ExtractionLifecycleAuthority()
    acquired = authority.acquire()
    assert acquired.state is ReceiptState.ACQUIRED
    assert acquired.extraction_completed_at is None and acquired.row_count is None
    done = authority.complete(row_count=10, byte_count=2048)
    assert done.state is ReceiptState.COMPLETED
    assert done.extraction_completed_at is not None
    assert done.extraction_started_at is not None
    assert done.extraction_completed_at >= done.extraction_started_at
    assert (done.row_count, done.byte_count) == (10, 2048)


def test_transitions_only_go_forward() -> None:
    authority = ExtractionLifecycleAuthority()
    with pytest.raises(LifecycleError) as err:
        authority.complete(row_count=1)
    assert err.value.code == "lifecycle_not_acquired"
    with pytest.raises(LifecycleError) as err:
        authority.acquire_snapshot(evidence(datetime.now(UTC)))
    assert err.value.code == "lifecycle_not_acquired"
    authority.acquire()
    with pytest.raises(LifecycleError) as err:
        authority.acquire()
    assert err.value.code == "lifecycle_already_acquired"
    authority.complete(row_count=1)
    with pytest.raises(LifecycleError) as err:
        authority.complete(row_count=2)
    assert err.value.code == "lifecycle_completed"
    assert authority.receipt.row_count == 1


def test_a_receipt_that_lies_cannot_be_built() -> None:
    now = datetime.now(UTC)
    with pytest.raises(ValidationError, match="needs extraction_started_at"):
        ExtractionLifecycleReceipt(extraction_completed_at=now, row_count=1)
    with pytest.raises(ValidationError, match="precedes"):
        ExtractionLifecycleReceipt(
            extraction_started_at=now,
            extraction_completed_at=now - timedelta(seconds=1),
            row_count=1,
        )
    with pytest.raises(ValidationError, match="only at completion"):
        ExtractionLifecycleReceipt(extraction_started_at=now, row_count=3)
    with pytest.raises(ValidationError, match="timezone-aware"):
        ExtractionLifecycleReceipt(extraction_started_at=datetime(2026, 1, 1))


def test_snapshot_fields_need_snapshot_evidence() -> None:
    now = datetime.now(UTC)
    with pytest.raises(ValidationError, match="needs snapshot evidence"):
        ExtractionLifecycleReceipt(
            extraction_started_at=now, clock_authority=PG_CLOCK, source_token=token_digest("x")
        )
    with pytest.raises(ValidationError, match="go together"):
        ExtractionLifecycleReceipt(
            extraction_started_at=now, clock_authority=PG_CLOCK, snapshot_authority="pg"
        )
    with pytest.raises(ValidationError, match="never the raw token"):
        ExtractionLifecycleReceipt(
            extraction_started_at=now,
            clock_authority=PG_CLOCK,
            snapshot_authority="pg",
            snapshot_acquired_at=now,
            source_token=RAW_TOKEN,
        )
    with pytest.raises(ValidationError, match="clock of the server"):
        ExtractionLifecycleReceipt(
            extraction_started_at=now,
            snapshot_authority="pg",
            snapshot_acquired_at=now,
        )


def test_the_receipt_holds_the_token_digest_never_the_raw_token() -> None:
    now = datetime.now(UTC)
    authority = ExtractionLifecycleAuthority()
    authority.acquire(started_at=now, clock_authority=PG_CLOCK)
    receipt = authority.acquire_snapshot(evidence(now))
    assert receipt.source_token == token_digest(RAW_TOKEN)
    assert receipt.source_token.startswith("sha256:")
    assert RAW_TOKEN not in receipt.model_dump_json()
    assert RAW_TOKEN not in repr(evidence(now))
    assert receipt.snapshot_authority == "postgresql.pg_export_snapshot"
    assert receipt.snapshot_acquired_at == now
    with pytest.raises(LifecycleError) as err:
        authority.acquire_snapshot(evidence(now))
    assert err.value.code == "lifecycle_snapshot_already_acquired"


def test_generic_adapters_cannot_claim_a_snapshot_on_the_orchestrator_clock() -> None:
    now = datetime.now(UTC)
    with pytest.raises(ValidationError):
        SnapshotEvidence(
            authority="x", token="t", acquired_at=now, clock_authority=ORCHESTRATOR_UTC
        )
    authority = ExtractionLifecycleAuthority()
    authority.acquire()  # orchestrator clock
    with pytest.raises(LifecycleError) as err:
        authority.acquire_snapshot(evidence(now))
    assert err.value.code == "lifecycle_clock_mismatch"
    assert authority.receipt.snapshot_authority is None


def test_a_server_clock_needs_its_own_timestamps() -> None:
    authority = ExtractionLifecycleAuthority()
    with pytest.raises(LifecycleError) as err:
        authority.acquire(clock_authority=PG_CLOCK)
    assert err.value.code == "lifecycle_clock_unproven"
    authority.acquire(started_at=datetime.now(UTC), clock_authority=PG_CLOCK)
    with pytest.raises(LifecycleError) as err:
        authority.complete(row_count=1)
    assert err.value.code == "lifecycle_clock_unproven"


def test_racing_threads_never_observe_a_torn_or_mutated_receipt() -> None:
    """Writers drive many authorities through every transition while readers watch.

    Every receipt a reader sees must be valid on its own, states must never go backwards, and
    every receipt object ever observed must be unchanged at the end.
    """
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        authorities = [ExtractionLifecycleAuthority() for _ in range(300)]
        observed: list[tuple[ExtractionLifecycleReceipt, dict[str, object]]] = []
        problems: list[str] = []
        done = threading.Event()
        order = {ReceiptState.PENDING: 0, ReceiptState.ACQUIRED: 1, ReceiptState.COMPLETED: 2}

        def write() -> None:
            for authority in authorities:
                start = datetime.now(UTC)
                authority.acquire(started_at=start, clock_authority=PG_CLOCK)
                authority.acquire_snapshot(evidence(start))
                authority.complete(row_count=7, byte_count=70, completed_at=datetime.now(UTC))
            done.set()

        def read() -> None:
            last = [0] * len(authorities)
            while not done.is_set():
                for i, authority in enumerate(authorities):
                    receipt = authority.receipt
                    rank = order[receipt.state]
                    if rank < last[i]:
                        problems.append(f"authority {i} went back to {receipt.state}")
                    last[i] = rank
                    if receipt.state is ReceiptState.COMPLETED and (
                        receipt.row_count != 7 or receipt.source_token is None
                    ):
                        problems.append(f"torn completed receipt {receipt!r}")
                    if len(observed) < 20_000:
                        observed.append((receipt, receipt.model_dump()))

        readers = [threading.Thread(target=read) for _ in range(3)]
        writer = threading.Thread(target=write)
        for t in readers:
            t.start()
        writer.start()
        writer.join(60)
        for t in readers:
            t.join(60)
    finally:
        sys.setswitchinterval(old_interval)
    assert not problems, problems[:5]
    assert observed, "the readers observed nothing"
    assert all(r.model_dump() == snap for r, snap in observed), "an observed receipt changed"
    assert all(a.is_completed for a in authorities)


def test_only_one_of_many_concurrent_completions_wins() -> None:
    authority = ExtractionLifecycleAuthority()
    authority.acquire()
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def complete(n: int) -> None:
        barrier.wait()
        try:
            authority.complete(row_count=n)
            outcomes.append("won")
        except LifecycleError as exc:
            outcomes.append(exc.code)

    threads = [threading.Thread(target=complete, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("won") == 1
    assert outcomes.count("lifecycle_completed") == 7
