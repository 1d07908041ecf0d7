"""A copy driven step by step (plan, extract, load), and one abandoned between steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpone_dagster.lifecycle import ReceiptState
from dpone_dagster.snapshot_copy import CopyError, CopyOptions, SnapshotCopy, SnapshotCopyOptions
from dpone_dagster.snapshot_copy.whole_copy import WholeCopyArtifact
from tests.helpers import pg


def test_the_steps_run_apart_and_each_publishes_at_its_boundary(
    source_dsn: str, target_dsn: str, tmp_path: Path
) -> None:
    pg.create_mixed_table(source_dsn, rows=400)
    with SnapshotCopy(
        source_dsn,
        target_dsn,
        "public.mixed",
        options=SnapshotCopyOptions(strategy="whole_copy"),
        tuning=CopyOptions(spool_dir=tmp_path),
    ) as copy:
        plans = copy.plan()
        assert [p.copy_format for p in plans] == ["binary"] and not plans[0].target_exists
        copy.extract()
        artifact = copy.extraction.artifacts[0]
        assert isinstance(artifact, WholeCopyArtifact) and artifact.path.exists()
        assert artifact.extraction_receipt.state is ReceiptState.COMPLETED
        assert pg.open_transactions(source_dsn) == [], "whole COPY committed after its files"
        assert not pg.table_exists(target_dsn, "public", "mixed"), "nothing loaded yet"
        report = copy.load()
    assert report.outcome == "success" and report.rows_loaded == 400
    assert not artifact.path.exists()
    assert copy.abort() is report, "the first decision wins"
    with pytest.raises(CopyError) as err:
        copy.load()
    assert err.value.code == "copy_already_settled"


@pytest.mark.parametrize("strategy", ["stream_rows", "partitioned_copy", "batched_copy"])
def test_an_abandoned_copy_is_settled_abort_and_closes_every_session(
    source_dsn: str, target_dsn: str, strategy: str
) -> None:
    pg.create_mixed_table(source_dsn, rows=50)
    options = SnapshotCopyOptions(strategy=strategy)  # type: ignore[arg-type]
    copy = SnapshotCopy(source_dsn, target_dsn, ["public.mixed"], options=options)
    with copy:
        copy.plan()
        copy.extract()
        if strategy == "batched_copy":
            next(copy.extraction.artifact(0).batches())  # type: ignore[attr-defined]
        assert len(pg.open_transactions(source_dsn)) == 1, "the snapshot is held"
    assert copy.report is not None and copy.report.outcome == "abort"
    assert pg.open_transactions(source_dsn) == pg.open_transactions(target_dsn) == []
    assert not pg.table_exists(target_dsn, "public", "mixed")
