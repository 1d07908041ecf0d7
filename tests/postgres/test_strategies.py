"""The transaction boundaries of each extraction strategy, seen from the server."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from dpone_dagster.lifecycle import LifecycleError, ReceiptState, token_digest
from dpone_dagster.postgres import ConnectionOptions, LazySnapshot, SnapshotSession, TableName
from dpone_dagster.postgres.catalog import table_columns
from dpone_dagster.postgres.snapshot import POSTGRES_CLOCK
from dpone_dagster.snapshot_copy.batched_copy import batched_copy
from dpone_dagster.snapshot_copy.internal_query import InternalQueryArtifact
from dpone_dagster.snapshot_copy.stream_rows import stream_rows
from dpone_dagster.snapshot_copy.whole_copy import extract_whole_copy
from tests.helpers import pg

MIXED = TableName("public", "mixed")


def _columns(dsn: str, table: TableName = MIXED) -> list:  # type: ignore[type-arg]
    with psycopg.connect(dsn) as conn:
        return table_columns(conn, table)


def test_whole_copy_receipts_the_written_file_before_the_read_only_transaction_commits(
    source_dsn: str, tmp_path: Path
) -> None:
    pg.create_mixed_table(source_dsn, rows=2000)
    session = SnapshotSession.open(source_dsn)
    result = extract_whole_copy(session, MIXED, _columns(source_dsn), tmp_path)
    artifact = result.artifact
    receipt = result.extraction_receipt
    assert receipt.state is ReceiptState.COMPLETED
    assert receipt.row_count == 2000
    assert receipt.byte_count == artifact.path.stat().st_size > 2000 * 100
    assert artifact.path.read_bytes().startswith(b"PGCOPY\n\xff\r\n\x00"), "binary COPY format"
    assert receipt.clock_authority == POSTGRES_CLOCK
    assert receipt.source_token == token_digest(session.evidence.token)
    assert receipt.snapshot_acquired_at <= receipt.extraction_started_at  # type: ignore[operator]
    # Completed, and the read-only transaction is still the caller's to commit.
    assert len(pg.open_transactions(source_dsn)) == 1
    session.commit_and_close()
    assert pg.open_transactions(source_dsn) == []
    terminal = artifact.abort()
    assert terminal.released_files == (str(artifact.path),) and not artifact.path.exists()


@pytest.mark.parametrize(
    ("outcome", "ended_with"),
    [("success", "commit"), ("abort", "rollback"), ("retain_commit_unknown", "rollback")],
)
def test_streamed_rows_hold_the_transaction_until_the_terminal_outcome(
    source_dsn: str, outcome: str, ended_with: str
) -> None:
    pg.create_mixed_table(source_dsn, rows=1200)
    session = SnapshotSession.open(source_dsn)
    result = stream_rows(session, MIXED, _columns(source_dsn), fetch_rows=500)
    assert result.extraction_receipt.state is ReceiptState.ACQUIRED
    rows = list(result.artifact.rows())
    assert len(rows) == 1200 and rows[0][0] == "1" and all(isinstance(v, str) for v in rows[1])
    assert result.extraction_receipt.state is ReceiptState.COMPLETED
    assert result.extraction_receipt.row_count == 1200
    assert len(pg.open_transactions(source_dsn)) == 1, "the cursor's transaction stays open"
    terminal = result.artifact.settle(outcome)
    assert terminal.source_action == ended_with and terminal.sources_closed
    assert session.transaction.ended_with == ended_with
    assert pg.open_transactions(source_dsn) == []
    with pytest.raises(LifecycleError):
        result.artifact.rows()


def test_batched_copy_acquires_on_first_consumption_and_completes_after_the_empty_batch(
    source_dsn: str,
) -> None:
    pg.create_mixed_table(source_dsn, rows=1000)
    app = "dpone-batched-test"
    opened: list[SnapshotSession] = []

    def opener() -> SnapshotSession:
        opened.append(SnapshotSession.open(source_dsn, ConnectionOptions(application_name=app)))
        return opened[0]

    result = batched_copy(
        LazySnapshot(opener), MIXED, _columns(source_dsn), key=["id"], batch_size=300
    )
    assert result.extraction_receipt.state is ReceiptState.PENDING
    assert pg.backends(source_dsn, app) == [], "building the generator opens nothing"
    batches = result.artifact.batches()
    assert pg.backends(source_dsn, app) == [], "nor does asking for the iterator"
    seen = []
    for batch in batches:
        if batch.index == 0:
            assert result.extraction_receipt.state is ReceiptState.ACQUIRED
            assert pg.backends(source_dsn, app) == [opened[0].backend_pid]
        if batch.terminal:
            assert result.extraction_receipt.state is ReceiptState.COMPLETED
            break
        assert result.extraction_receipt.state is ReceiptState.ACQUIRED
        assert sum(1 for _ in batch.blocks()) > 0
        seen.append((batch.lower, batch.upper, batch.rows))
        assert result.extraction_receipt.state is ReceiptState.ACQUIRED, (
            "a consumed batch is not proof of exhaustion"
        )
    assert seen == [
        (None, ("300",), 300),
        (("300",), ("600",), 300),
        (("600",), ("900",), 300),
        (("900",), ("1000",), 100),
    ]
    receipt = result.extraction_receipt
    assert receipt.row_count == 1000 and receipt.byte_count and receipt.byte_count > 1000 * 100
    assert result.artifact.success().source_action == "commit"
    assert pg.open_transactions(source_dsn) == []


def test_a_batch_must_be_read_before_the_next_is_requested(source_dsn: str) -> None:
    pg.create_mixed_table(source_dsn, rows=10)
    lazy = LazySnapshot(lambda: SnapshotSession.open(source_dsn))
    artifact = batched_copy(lazy, MIXED, _columns(source_dsn), key=["id"], batch_size=4).artifact
    batches = artifact.batches()
    next(batches)
    with pytest.raises(LifecycleError) as err:
        next(batches)
    assert err.value.code == "batch_not_consumed"
    artifact.abort()
    assert pg.open_transactions(source_dsn) == []


def test_the_internal_query_window_brackets_the_statement_and_claims_no_snapshot_alone(
    source_dsn: str,
) -> None:
    pg.create_mixed_table(source_dsn, rows=500)
    pg.execute(
        source_dsn,
        "CREATE VIEW public.timed AS SELECT id, clock_timestamp() AS read_at FROM public.mixed",
    )
    pg.execute(source_dsn, "CREATE TABLE public.staged (id bigint, read_at timestamptz)")
    view = TableName("public", "timed")
    artifact = InternalQueryArtifact(view, _columns(source_dsn, view))
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE")
        assert artifact.load_into(conn, TableName("public", "staged")) == 500
        conn.execute("COMMIT")
    receipt = artifact.extraction_receipt
    assert receipt.state is ReceiptState.COMPLETED and receipt.row_count == 500
    assert not receipt.has_snapshot and receipt.source_token is None
    assert receipt.byte_count is None, "no file, no bytes"
    first, last = pg.fetch_all(source_dsn, "SELECT min(read_at), max(read_at) FROM public.staged")[
        0
    ]
    assert receipt.extraction_started_at <= first <= last <= receipt.extraction_completed_at  # type: ignore[operator]
    assert artifact.success().source_action == "none", "no cursor, no source transaction"
