"""Terminal outcomes against real files and real PostgreSQL source transactions."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest
from pydantic import ValidationError

from dpone_dagster.lifecycle import (
    ArtifactTerminalReceipt,
    ExtractionArtifact,
    LifecycleError,
    TerminalOutcome,
)
from dpone_dagster.postgres.session import SourceTransaction
from tests.helpers import pg

APP = "dpone-test-terminal"


def open_source(dsn: str, tag: str) -> SourceTransaction:
    """A real source transaction that leaves a visible mark only if it commits."""
    conn = psycopg.connect(dsn, application_name=APP)
    conn.execute("INSERT INTO marks (tag) VALUES (%s)", (tag,))
    cursor = conn.cursor(name=f"cur_{tag}")
    cursor.execute("SELECT g FROM generate_series(1, 1000) AS g")
    cursor.fetchmany(10)
    return SourceTransaction(conn, [cursor])


@pytest.fixture
def marks_dsn(source_dsn: str) -> str:
    pg.execute(source_dsn, "CREATE TABLE marks (tag text)")
    return source_dsn


def make_files(tmp_path: Path, n: int = 2) -> list[Path]:
    files = []
    for i in range(n):
        path = tmp_path / f"part-{i}.bin"
        path.write_bytes(b"evidence" * 100)
        files.append(path)
    return files


def marks(dsn: str) -> set[str]:
    return {str(r[0]) for r in pg.fetch_all(dsn, "SELECT tag FROM marks")}


@pytest.mark.parametrize(
    ("outcome", "files_kept", "committed", "action"),
    [
        (TerminalOutcome.SUCCESS, False, True, "commit"),
        (TerminalOutcome.ABORT, False, False, "rollback"),
        (TerminalOutcome.RETAIN_COMMIT_UNKNOWN, True, False, "rollback"),
    ],
)
def test_the_outcome_table_holds(
    marks_dsn: str,
    tmp_path: Path,
    outcome: TerminalOutcome,
    files_kept: bool,
    committed: bool,
    action: str,
) -> None:
    files = make_files(tmp_path)
    artifact = ExtractionArtifact(files=files)
    source = open_source(marks_dsn, outcome.value)
    artifact.attach_source(source)
    assert pg.open_transactions(marks_dsn, APP), "the source transaction should be open"

    receipt = artifact.settle(outcome)

    assert receipt.outcome is outcome
    assert all(p.exists() for p in files) is files_kept
    assert (set(receipt.retained_files) == {str(p) for p in files}) is files_kept
    assert (set(receipt.released_files) == {str(p) for p in files}) is not files_kept
    assert receipt.source_action == action
    assert receipt.sources_closed and receipt.cleanup_succeeded
    assert receipt.cleanup_error_code is None
    assert (outcome.value in marks(marks_dsn)) is committed
    assert source.conn.closed and source.ended_with == action
    assert not pg.open_transactions(marks_dsn, APP), "live cursors and transactions always close"
    assert not pg.backends(marks_dsn, APP)


def test_the_first_decision_wins_and_repeats_return_the_same_receipt(
    marks_dsn: str,
    tmp_path: Path,
) -> None:
    files = make_files(tmp_path)
    artifact = ExtractionArtifact(files=files)
    artifact.attach_source(open_source(marks_dsn, "first"))
    first = artifact.abort()
    assert artifact.success() is first
    assert artifact.retain_commit_unknown() is first
    assert artifact.settle("success") is first
    assert first.outcome is TerminalOutcome.ABORT
    assert "first" not in marks(marks_dsn), "a later success must not commit an aborted source"


def test_concurrent_decisions_agree(tmp_path: Path) -> None:
    artifact = ExtractionArtifact(files=make_files(tmp_path, 5))
    barrier = threading.Barrier(6)
    receipts: list[ArtifactTerminalReceipt] = []
    outcomes = list(TerminalOutcome) * 2

    def decide(outcome: TerminalOutcome) -> None:
        barrier.wait()
        receipts.append(artifact.settle(outcome))

    threads = [threading.Thread(target=decide, args=(o,)) for o in outcomes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(r) for r in receipts}) == 1
    assert len(receipts[0].released_files) + len(receipts[0].retained_files) == 5


def test_a_view_cannot_reverse_a_root_retain_commit_unknown(marks_dsn: str, tmp_path: Path) -> None:
    files = make_files(tmp_path)
    root = ExtractionArtifact(files=files)
    root.attach_source(open_source(marks_dsn, "retained"))
    view = root.view()
    wrapper = ExtractionArtifact(share_with=root)
    decided = root.retain_commit_unknown()
    assert view.success() is decided
    assert wrapper.abort() is decided
    assert all(p.exists() for p in files), "a view must never delete retained evidence"
    assert root.terminal.files.release() == root.terminal.files.retain()
    assert all(p.exists() for p in files)
    assert "retained" not in marks(marks_dsn)


def test_views_share_one_exactly_once_file_release(tmp_path: Path) -> None:
    files = make_files(tmp_path)
    root = ExtractionArtifact(files=files)
    view = root.view()
    receipt = view.abort()
    assert not any(p.exists() for p in files)
    # A file recreated at the same path afterwards is not the artifact's any more:
    files[0].write_bytes(b"someone else's")
    assert root.abort() is receipt
    assert files[0].exists(), "release happens exactly once"


def test_a_failed_deletion_is_recorded_and_never_reported_as_clean(tmp_path: Path) -> None:
    files = make_files(tmp_path)
    artifact = ExtractionArtifact(files=files)
    # The tests run as root, so permissions cannot make unlink fail. A path that has become a
    # non-empty directory can: unlink() refuses directories.
    files[1].unlink()
    files[1].mkdir()
    (files[1] / "inner").write_text("x")

    with pytest.raises(ValueError, match="primary load failure"):
        try:
            raise ValueError("primary load failure")
        except ValueError:
            receipt = artifact.abort()  # must not raise, must not replace the primary error
            raise

    assert receipt.cleanup_succeeded is False
    assert receipt.cleanup_error_code == "file_release_failed"
    assert (
        receipt.cleanup_error_detail is not None
        and "IsADirectoryError" in receipt.cleanup_error_detail
    )
    assert str(files[1]) in receipt.retained_files
    assert str(files[0]) in receipt.released_files
    assert files[1].is_dir()


def test_a_failed_source_rollback_is_recorded(marks_dsn: str, tmp_path: Path) -> None:
    artifact = ExtractionArtifact(files=make_files(tmp_path, 1))
    source = open_source(marks_dsn, "killed")
    artifact.attach_source(source)
    pg.terminate(pg.backends(marks_dsn, APP))
    receipt = artifact.abort()
    assert receipt.cleanup_succeeded is False
    assert receipt.cleanup_error_code == "source_rollback_failed"
    assert receipt.sources_closed
    assert source.conn.closed
    assert not receipt.retained_files, "the files were still released"


def test_a_receipt_cannot_claim_a_clean_cleanup_with_an_error() -> None:
    with pytest.raises(ValidationError):
        ArtifactTerminalReceipt(
            artifact_id="a",
            outcome=TerminalOutcome.ABORT,
            decided_at="2026-01-01T00:00:00Z",
            source_action="rollback",
            sources_closed=True,
            cleanup_succeeded=True,
            cleanup_error_code="file_release_failed",
        )
    with pytest.raises(ValidationError):
        ArtifactTerminalReceipt(
            artifact_id="a",
            outcome=TerminalOutcome.ABORT,
            decided_at="2026-01-01T00:00:00Z",
            source_action="commit",
            sources_closed=True,
            cleanup_succeeded=True,
        )


def test_a_source_attached_after_the_decision_is_closed_at_once(marks_dsn: str) -> None:
    artifact = ExtractionArtifact()
    artifact.success()
    late = open_source(marks_dsn, "late")
    with pytest.raises(LifecycleError) as err:
        artifact.attach_source(late)
    assert err.value.code == "artifact_already_settled"
    assert late.conn.closed and late.ended_with == "rollback"
    assert "late" not in marks(marks_dsn)


def test_files_cannot_be_registered_after_settlement(tmp_path: Path) -> None:
    artifact = ExtractionArtifact()
    artifact.abort()
    with pytest.raises(LifecycleError) as err:
        artifact.register_file(tmp_path / "late.bin")
    assert err.value.code == "artifact_files_settled"
