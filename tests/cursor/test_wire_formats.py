"""The cursor engines' wire formats, pinned: ids, digests, checkpoints, the stored documents'
keys, and each policy's phases with the sessions' states at ``commit``.

Ledgers in use hold these values: a backfill finds its run again from its scope's digest, a
stream its state from its tables; a lost commit is replayed by the batch's digest; the receipts
chain by checkpoint; and an older worker refuses a document with a field it does not know. Each
golden below was computed once from the fixed inputs beside it and is written as a literal: a
test that fails here has changed the wire format (or the crash guarantees' phases), which no
refactoring may do.
"""

from __future__ import annotations

from datetime import UTC, datetime

from dpone_dagster.backfill import (
    ApplyPath,
    Backfill,
    BackfillEvidence,
    BackfillOptions,
    BackfillRun,
    BackfillScope,
    BatchObservation,
    BatchReceipt,
    TableRef,
    TrustworthyCursor,
)
from dpone_dagster.core.ledger import as_json
from dpone_dagster.core.sessions import Sessions, prepared_session
from dpone_dagster.cursor.run_rules import (
    apply_batch,
    checkpoint_for,
    digest,
    next_request,
    run_id_for,
    start_run,
)
from dpone_dagster.cursor.stream_documents import (
    Checkpoint,
    RunInProgress,
    StreamReceipt,
    StreamState,
)
from dpone_dagster.incremental import IncrementalSync
from dpone_dagster.lifecycle import ExtractionLifecycleReceipt
from dpone_dagster.postgres.connection import ConnectionOptions
from tests.backfill.conftest import Pair
from tests.helpers import pg
from tests.incremental.conftest import Stream

T0 = datetime(2024, 1, 1, tzinfo=UTC)
T1 = datetime(2024, 1, 1, 0, 0, 5, tzinfo=UTC)
SCOPE = BackfillScope(
    label="wire",
    source=TableRef(database="shop", schema_name="Sales Ops", name="Order Items"),
    target=TableRef(database="warehouse", schema_name="copy", name="Items"),
    cursor="id",
    cursor_type="bigint",
    key=("id",),
    columns=("id", "note", "amount"),
    lower="0",
    upper="1000",
)
EXTRACTION = ExtractionLifecycleReceipt(
    extraction_started_at=T0,
    clock_authority="postgresql.clock_timestamp",
    extraction_completed_at=T1,
    snapshot_acquired_at=T0,
    snapshot_authority="postgresql.pg_current_snapshot",
    source_token="sha256:" + "c" * 64,
    row_count=500,
    byte_count=12345,
)
SEEN = BatchObservation(
    upper="500",
    first_cursor="1",
    last_cursor="500",
    source_count=500,
    copy_out_count=500,
    copy_in_count=500,
    target_count=500,
    copied_count=500,
    duplicate_count=0,
    content_hash="sha256:" + "a" * 64,
    byte_count=12345,
    final=False,
    apply_path=ApplyPath.DIRECT,
    extraction=EXTRACTION,
)


def first_batch() -> tuple[BackfillRun, BackfillRun, BatchReceipt]:
    """The planned run of :data:`SCOPE` and the run and receipt after its first batch."""
    evidence = BackfillEvidence(
        kind="source_boundary", subject="990", digest="sha256:" + "b" * 64, detail="fixed"
    )
    boundary = TrustworthyCursor(cursor="id", source_high_water_mark="990")
    run = start_run(SCOPE, boundary, rows_at_boundary=990, boundary_evidence=evidence)
    after, receipt = apply_batch(run, next_request(run, 500), SEEN)
    return run, after, receipt


def stream_documents() -> tuple[StreamState, StreamReceipt]:
    """A stream's state with a run in progress, and a receipt, every field set."""
    last = Checkpoint(cursor="2024-01-01 00:00:05+00", key=("42",))
    run = RunInProgress(
        number=2, lower="2023-12-31 00:00:00+00", mark="2024-01-01 00:00:09+00", taken_at=T0,
        snapshot_token_digest="sha256:" + "d" * 64, checkpoint=last, unsettled=("3/7",),
        rescan_from="2023-12-31 00:00:00+00", awaited=1, inserted=40, updated=2, batches=1,
    )  # fmt: skip
    state = StreamState(
        stream_id="incremental:" + "e" * 32, revision=3, mark="2023-12-31 00:00:00+00",
        mark_taken_at=T0, runs=1, sequence=4, unsettled=("3/7",),
        rescan_from="2023-12-30 00:00:00+00", run=run,
    )  # fmt: skip
    receipt = StreamReceipt(
        stream_id=state.stream_id, sequence=4, run=2, after=None, last=last, rows=42,
        inserted=40, updated=2, deleted=1, keys_compared=7, final=True, extraction=EXTRACTION,
    )  # fmt: skip
    return state, receipt


def test_a_backfills_run_id_digests_and_checkpoints_are_pinned() -> None:
    run, after, receipt = first_batch()
    request = next_request(run, 500)
    assert run_id_for(SCOPE) == run.run_id == "backfill:122827003bd80a2e1f402f949b1ca7eb"
    assert run.run_digest == (
        "sha256:a9dd9401cc89fa18e75e2e4b57a841f768b7751057a19868c372a679739c2167"
    )
    assert (request.batch_id, digest(request)) == (
        "000000001", "sha256:27a94ecfa041281fc2b69a7f7e6871925e50383297e67d1f5105ca34fa08e1dd",
    )  # fmt: skip
    assert receipt.batch_digest == digest(request)
    checkpoint = checkpoint_for(run.run_id, None, digest(request), SEEN)
    assert receipt.checkpoint == checkpoint
    assert checkpoint == "sha256:a5e876d701c920256fa49333398747d4069ff26aaad6a0a277f72a5d209057c1"
    assert after.run_digest == (
        "sha256:58af04bd5f4664b9222fdc7c23aaa2087f8f51ab869f6f30e197120d514603b7"
    )


def test_a_streams_id_is_pinned() -> None:
    # Real sessions on the one database every server has: the id digests the databases' names.
    dsn = pg.with_db(pg.admin_dsn(), "postgres")
    sync = IncrementalSync(
        dsn, dsn, '"Sales Ops"."Order Items"', cursor="updated_at", target_table="copy.Items",
        label="wire",
    )  # fmt: skip
    with prepared_session(dsn, None, "source") as src, prepared_session(dsn, None, "target") as tgt:
        stream_id = sync.stream_id(Sessions(src, tgt, tgt))
    assert stream_id == "incremental:3bd566571b298f4880e3345ee714faf7"


def test_the_stored_documents_keys_and_digests_are_pinned() -> None:
    run, _, receipt = first_batch()
    state, stream_receipt = stream_documents()
    documents = {"run": run, "receipt": receipt, "state": state, "stream_receipt": stream_receipt}
    stored = {name: as_json(document).obj for name, document in documents.items()}
    assert {name: sorted(document) for name, document in stored.items()} == {
        "run": [
            "boundary", "candidate_authoritative", "effects", "evidence",
            "linked_authority_remains_authoritative", "next_actions", "progress", "protocol",
            "revision", "run_digest", "run_id", "scope", "snapshot_label", "status",
        ],
        "receipt": [
            "after", "batch_digest", "batch_id", "candidate_authoritative", "checkpoint",
            "observation", "previous_checkpoint", "run_id", "sequence",
            "source_authority_unchanged", "source_high_water_mark",
        ],
        "state": [
            "mark", "mark_taken_at", "rescan_from", "revision", "run", "runs", "sequence",
            "stream_id", "unsettled",
        ],
        "stream_receipt": [
            "after", "deleted", "extraction", "final", "inserted", "keys_compared", "last",
            "rows", "run", "sequence", "stream_id", "updated", "verification",
        ],
    }  # fmt: skip
    assert sorted(stored["receipt"]["observation"]) == [
        "apply_path", "byte_count", "content_hash", "copied_count", "copy_in_count",
        "copy_out_count", "duplicate_count", "extraction", "final", "first_cursor",
        "last_cursor", "row_versions", "source_count", "target_count", "upper",
    ]  # fmt: skip
    assert sorted(stored["state"]["run"]) == [
        "awaited", "batches", "checkpoint", "inserted", "lower", "mark", "number",
        "rescan_from", "snapshot_token_digest", "taken_at", "unsettled", "updated",
    ]  # fmt: skip
    # Every nested field's name and spelling of its value, at once.
    assert {name: digest(document) for name, document in stored.items()} == {
        "run": "sha256:7a03c3ed92bb16c679c96c1dc1d44b31909433f8cb47790bbe8c4663c5179b49",
        "receipt": "sha256:582d5f2e67fcbc03dbce1dc45aa8a93aab28edda4e2e4145853daffd32535528",
        "state": "sha256:b3578217ab609f98879de01706ab173146eabcd27e301c32c33881d5437ebe06",
        "stream_receipt": (
            "sha256:720e2684075bd83c132d244c10ff9a6da6c1d592c4b73fc58d08ed89eaa9c412"
        ),
    }


def states(names: tuple[str, str]) -> tuple[object, ...]:
    """How the server sees the one session of each application name (source, target):
    ``idle``, ``idle in transaction``..."""
    query = "SELECT state FROM pg_stat_activity WHERE application_name = %s"
    found = [pg.fetch_all(pg.admin_dsn(), query, (name,)) for name in names]
    return tuple(rows[0][0] if len(rows) == 1 else rows for rows in found)


IDLE, IN_TRANSACTION = "idle", "idle in transaction"
FIXED_MARK_BATCH = [
    ("copy", IN_TRANSACTION, IN_TRANSACTION),
    ("commit", IDLE, IN_TRANSACTION),  # rows and receipt commit next; the source's read ended
    ("committed", IDLE, IDLE),
]
MOVING_MARK_BATCH = [
    ("copy", IN_TRANSACTION, IN_TRANSACTION),
    ("apply", IN_TRANSACTION, IN_TRANSACTION),
    # Rows, receipt and state commit next; the source's read ended (the final check read it
    # before): the one batch-commit protocol's states, the fixed mark's too.
    ("commit", IDLE, IN_TRANSACTION),
    ("committed", IDLE, IDLE),
]
"""Each policy's phases in one batch, with the (source, target) sessions' states at each."""


def test_a_backfills_phases_and_its_sessions_at_each_are_pinned(pair: Pair) -> None:
    names = ("dpone-wire-fixed-source", "dpone-wire-fixed-target")
    seen: list[tuple[object, ...]] = []
    backfill = Backfill(
        pair.source, pair.target, "public.mixed", cursor="id",
        options=BackfillOptions(batch_size=2000),
        connection_options=ConnectionOptions(application_name=names[0]),
        target_connection_options=ConnectionOptions(application_name=names[1]),
        on_phase=lambda phase: seen.append((phase, *states(names))),
    )  # fmt: skip
    backfill.run()
    assert seen == FIXED_MARK_BATCH * 3


def test_a_streams_phases_and_its_sessions_at_each_are_pinned(stream: Stream) -> None:
    names = ("dpone-wire-moving-source", "dpone-wire-moving-target")
    seen: list[tuple[object, ...]] = []
    stream.run(
        connection_options=ConnectionOptions(application_name=names[0]),
        target_connection_options=ConnectionOptions(application_name=names[1]),
        on_phase=lambda phase: seen.append((phase, *states(names))),
    )
    assert seen == MOVING_MARK_BATCH * 3
