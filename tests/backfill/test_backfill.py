"""The backfill end to end against real databases: batches, receipts, resume, partitions."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from dpone_dagster.backfill import (
    ApplyPath,
    Backfill,
    BackfillOptions,
    BackfillStatus,
    BatchResult,
)
from dpone_dagster.lifecycle import SnapshotLabel
from tests.backfill.conftest import Pair, copy_rows
from tests.helpers import pg


def test_batches_copy_every_row_with_receipts_that_prove_it(pair: Pair) -> None:
    seen: list[BatchResult] = []
    result = pair.backfill(BackfillOptions(batch_size=700)).run(on_batch=seen.append)
    src, dst = pair.fingerprints()
    assert src == dst and src[0] == 5000
    assert result.run.status is BackfillStatus.SUCCEEDED
    assert result.snapshot_label is SnapshotLabel.SEVERAL_SNAPSHOTS_RECONCILED
    assert result.reconciliation is not None and result.reconciliation.ok
    assert [r.receipt.sequence for r in seen] == list(range(1, 9))
    assert [r.run.progress.remaining_estimate for r in seen][-1] == 0
    uppers = []
    for r in seen:
        o = r.receipt.observation
        assert o.source_count == o.copy_out_count == o.copy_in_count == o.target_count
        assert o.copied_count == o.source_count and o.apply_path is ApplyPath.DIRECT
        assert o.extraction.source_token and o.extraction.source_token.startswith("sha256:")
        assert o.extraction.extraction_completed_at is not None
        assert o.extraction.clock_authority == "postgresql.clock_timestamp"
        uppers.append(int(o.upper or 0))
    assert uppers == [700, 1400, 2100, 2800, 3500, 4200, 4900, 5000]
    assert seen[0].receipt.observation.first_cursor == "1"


TARGET_READS = """
SELECT t.n_tup_ins, t.seq_tup_read, coalesce(t.idx_tup_fetch, 0), i.idx_tup_read
FROM pg_stat_user_tables t JOIN pg_stat_user_indexes i ON i.relid = t.relid
WHERE t.relname = 'mixed'
"""


def test_a_batch_into_an_empty_range_takes_its_target_count_from_its_copy_and_reads_no_row(
    pair: Pair,
) -> None:
    """A batch into an empty range of a table without triggers counts its rows by its COPY's
    command tag and reads none of them back (the server's own statistics of the target)."""
    with pair.backfill(BackfillOptions(batch_size=1000)) as b:
        result = b.run(reconcile=False)
    receipts = [r.observation for r in Backfill(
        pair.source, pair.target, "public.mixed", cursor="id").receipts()]  # fmt: skip
    assert result.committed == 5 and [o.target_count for o in receipts] == [1000] * 5
    assert all(o.copy_in_count == o.target_count and o.row_versions for o in receipts)
    # Every backend of the run has ended (the Backfill closed them), so its counters are in.
    _, seq_read, fetched, index_read = pg.wait_until(
        lambda: (found := pg.fetch_all(pair.target, TARGET_READS)) and found[0][0] == 5000
        and found[0], timeout=30, what="the target's statistics show the 5,000 inserted rows",
    )  # fmt: skip
    # Per batch: the empty range's probe reads nothing, the evidence's probe one row.
    assert (seq_read, fetched) == (0, 5) and index_read <= 5


def test_a_new_process_loads_the_last_committed_state_and_resumes_after_it(pair: Pair) -> None:
    first = pair.backfill(BackfillOptions(batch_size=1000))
    partial = first.run(max_batches=2)
    first.close()
    assert partial.run.status is BackfillStatus.IN_PROGRESS and partial.reconciliation is None
    again = pair.backfill(BackfillOptions(batch_size=1000))
    loaded = again.load()
    assert loaded == partial.run
    assert loaded is not None and loaded.progress.next_after == "2000"
    done = again.run()
    assert done.committed == 3 and done.run.progress.copied_count == 5000
    again.verify()
    assert pair.fingerprints()[0] == pair.fingerprints()[1]
    assert Backfill(pair.source, pair.target, "public.mixed", cursor="id").run().committed == 0


def test_timestamp_partitions_with_tied_cursor_values_copy_each_row_once(
    source_dsn: str, target_dsn: str
) -> None:
    ddl = (
        "CREATE TABLE ev (id int PRIMARY KEY, at timestamptz NOT NULL, v text);"
        " CREATE INDEX ON ev (at)"
    )
    for dsn in (source_dsn, target_dsn):
        pg.execute(dsn, ddl)
    # 2,000 rows, five per minute: every batch boundary falls inside a run of ties.
    pg.execute(
        source_dsn,
        "INSERT INTO ev SELECT g, timestamptz '2024-01-01 00:00+00'"
        " + (g / 5) * interval '1 minute', md5(g::text) FROM generate_series(0, 1999) g",
    )
    bounds = [None, datetime(2024, 1, 1, 1, 0, tzinfo=UTC), "2024-01-01 03:00+00", None]
    run_ids = set()
    batches = BackfillOptions(batch_size=7)
    for lower, upper in zip([*bounds[:2], bounds[2]], [bounds[1], bounds[2], None], strict=True):
        backfill = Backfill(
            source_dsn, target_dsn, "ev", cursor="at", options=batches, lower=lower, upper=upper
        )
        result = backfill.run()
        run_ids.add(result.run.run_id)
        assert result.reconciliation is not None and result.reconciliation.ok
        sizes = {r.observation.source_count for r in backfill.receipts()[:-1]}
        assert sizes == {10}, sizes  # 7 rows rounded up to whole minutes of 5 ties
    assert len(run_ids) == 3
    assert pg.table_fingerprint(source_dsn, "public", "ev") == pg.table_fingerprint(
        target_dsn, "public", "ev"
    )


def test_existing_equal_rows_are_counted_as_duplicates_not_copied_twice(pair: Pair) -> None:
    copy_rows(pair.source, pair.target, "SELECT * FROM mixed WHERE id BETWEEN 1200 AND 1300")
    result = pair.backfill(BackfillOptions(batch_size=1000)).run()
    assert result.run.progress.copied_count == 4899
    assert result.run.progress.duplicate_count == 101
    assert pair.fingerprints()[0] == pair.fingerprints()[1]


def test_the_run_document_in_the_ledger_does_not_grow_with_batches(pair: Pair) -> None:
    backfill = pair.backfill(BackfillOptions(batch_size=50))
    sizes = []
    for result in backfill.batches():
        if result.receipt.sequence in (10, 99):
            sizes.append(
                pg.fetch_one(
                    pair.target, "SELECT pg_column_size(run_json) FROM dpone_ledger.backfill_runs"
                )
            )
    assert len(sizes) == 2 and abs(int(sizes[0]) - int(sizes[1])) <= 16, sizes  # type: ignore[call-overload]
    assert (
        pg.fetch_one(pair.target, "SELECT count(*) FROM dpone_ledger.backfill_batch_receipts")
        == 100
    )


def test_the_snapshot_label_tells_one_snapshot_from_none(
    pair: Pair, make_database: Callable[[str], str]
) -> None:
    one = pair.backfill(BackfillOptions(batch_size=5000)).run()
    assert one.snapshot_label is SnapshotLabel.SINGLE_SNAPSHOT and one.run.progress.batch_count == 1
    empty_source = make_database("dpone_empty")
    pg.create_mixed_table(empty_source, rows=0)
    nothing = Backfill(empty_source, pair.target, "public.mixed", cursor="id").run()
    assert nothing.run.status is BackfillStatus.SUCCEEDED
    assert nothing.run.boundary.source_high_water_mark is None  # type: ignore[union-attr]
    assert (
        nothing.snapshot_label is SnapshotLabel.NO_ROWS_COPIED
        and nothing.run.progress.batch_count == 1
    )
    assert nothing.reconciliation is not None and nothing.reconciliation.ranges == ()


_UNCERTIFIED = """
CREATE TABLE public.spans (id bigint PRIMARY KEY, words tsvector, seats int4range, at time);
"""


@pytest.mark.cross_server
def test_a_backfill_moves_types_not_certified_across_major_versions_as_text_in_its_scope(
    source_dsn: str, target_dsn: str
) -> None:
    pg.execute(source_dsn, _UNCERTIFIED)
    pg.execute(target_dsn, _UNCERTIFIED)
    pg.execute(
        source_dsn,
        "INSERT INTO public.spans SELECT g, to_tsvector('simple', 'row ' || g),"
        " int4range(g, g + 5), time '00:00' + g * interval '1 second'"
        " FROM generate_series(1, 2500) g",
    )
    options = BackfillOptions(batch_size=1000)
    result = Backfill(source_dsn, target_dsn, "public.spans", cursor="id", options=options).run()
    same_version = pg.server_version(source_dsn) == pg.server_version(target_dsn)
    assert result.run.scope.copy_format == ("binary" if same_version else "text")
    assert result.reconciliation is not None and result.reconciliation.ok
    assert pg.table_fingerprint(source_dsn, "public", "spans") == pg.table_fingerprint(
        target_dsn, "public", "spans"
    )
