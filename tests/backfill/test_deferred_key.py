"""A target the backfill creates gets its primary key once its rows are in (the deferred key):
the keyless load, a kill -9 at any moment of it, another run arriving, a key put in twice by
hand, and the tables whose key is not deferred."""

from __future__ import annotations

import random
import threading

import psycopg
import pytest

from dpone_dagster.backfill import (
    Backfill,
    BackfillOptions,
    prepare_target,
)
from dpone_dagster.backfill.deferred_key import MARKER
from dpone_dagster.core.errors import EngineError
from dpone_dagster.postgres import TableName
from dpone_dagster.reconcile import Proof
from tests.backfill.conftest import wait_for_older_transactions
from tests.helpers import crash, pg

MIXED = TableName("public", "mixed")

KEY_STATE = """SELECT
    EXISTS (SELECT 1 FROM pg_index WHERE indrelid = 'public.mixed'::regclass AND indisprimary),
    (SELECT count(*) FROM pg_index WHERE indrelid = 'public.mixed'::regclass),
    obj_description('public.mixed'::regclass, 'pg_class')"""


def key_state(target: str) -> tuple[bool, int, str | None]:
    """(has its primary key, how many indexes, its comment) of the target's ``public.mixed``."""
    row = pg.fetch_all(target, KEY_STATE)[0]
    return bool(row[0]), int(row[1]), row[2]  # type: ignore[call-overload]


def keyless_target(source: str, target: str, rows: int) -> None:
    """A source of ``rows`` mixed rows; the target table created by ``prepare_target`` with its
    key deferred."""
    pg.create_mixed_table(source, rows=rows)
    prepared = prepare_target(source, target, MIXED, MIXED, "id", defer_key=True)
    assert prepared.created and prepared.deferred_key


def loader(source: str, target: str, batch: int) -> Backfill:
    options = BackfillOptions(batch_size=batch)
    return Backfill(source, target, MIXED, cursor="id", options=options, keyless_load=True)


def test_a_keyless_load_writes_no_index_then_gets_its_key_and_every_range_proven_by_row_versions(
    source_dsn: str, target_dsn: str
) -> None:
    keyless_target(source_dsn, target_dsn, 5000)
    has_key, indexes, comment = key_state(target_dsn)
    assert (has_key, indexes) == (False, 0) and comment is not None and comment.startswith(MARKER)

    with loader(source_dsn, target_dsn, 1000) as job:
        result = job.run(reconcile=False)
        receipts = job.receipts()
        assert result.run.progress.copied_count == 5000 and result.reconciliation is None
        assert key_state(target_dsn)[:2] == (False, 0), "no index while the rows go in"
        for receipt in receipts:  # no savepoint: the rows carry the batch transaction's own id
            versions = receipt.observation.row_versions
            assert versions is not None
            assert versions.target_xids == (versions.target_top_xid % 2**32,)

        assert job.build_key() is True
        assert key_state(target_dsn) == (True, 1, None)
        assert job.build_key() is False, "built once"

    wait_for_older_transactions(source_dsn)
    with loader(source_dsn, target_dsn, 1000) as job:
        report = job.reconcile()
    assert report.ok and report.proven_by(Proof.ROW_VERSIONS) == len(report.ranges) == 5
    assert pg.table_fingerprint(source_dsn, "public", "mixed") == pg.table_fingerprint(
        target_dsn, "public", "mixed"
    )


def test_a_reconciliation_builds_a_deferred_key_first(source_dsn: str, target_dsn: str) -> None:
    keyless_target(source_dsn, target_dsn, 2000)
    with loader(source_dsn, target_dsn, 500) as job:
        result = job.run()  # batches, then the reconciliation: the key comes before it
    assert result.reconciliation is not None and result.reconciliation.ok
    assert key_state(target_dsn) == (True, 1, None)


def test_another_run_arriving_mid_load_builds_the_key_first_and_the_loader_goes_on(
    source_dsn: str, target_dsn: str
) -> None:
    keyless_target(source_dsn, target_dsn, 6000)
    first = loader(source_dsn, target_dsn, 1000)
    try:
        assert len(list(first.batches(max_batches=2))) == 2
        assert key_state(target_dsn)[0] is False
        # Another orchestrator of the same run (a retry, a second worker) plans: the key first.
        other = Backfill(source_dsn, target_dsn, MIXED, cursor="id",
                         options=BackfillOptions(batch_size=1000))  # fmt: skip
        with other:
            assert len(list(other.batches(max_batches=2))) == 2
        assert key_state(target_dsn) == (True, 1, None)
        # The loader's next batches go into the keyed table.
        result = first.run()
    finally:
        first.close()
    assert result.reconciliation is not None and result.reconciliation.ok
    run = result.run
    assert run.progress.copied_count == 6000 and run.progress.duplicate_count == 0
    assert pg.table_fingerprint(source_dsn, "public", "mixed") == pg.table_fingerprint(
        target_dsn, "public", "mixed"
    )


def test_the_key_build_waits_for_a_batch_open_on_the_table_then_completes(
    source_dsn: str, target_dsn: str
) -> None:
    keyless_target(source_dsn, target_dsn, 2000)
    with loader(source_dsn, target_dsn, 1000) as job:
        assert len(list(job.batches(max_batches=1))) == 1
    built: list[bool] = []
    with psycopg.connect(target_dsn) as batch:  # a batch's COPY holds ROW EXCLUSIVE until it ends
        batch.execute("LOCK TABLE public.mixed IN ROW EXCLUSIVE MODE")
        other = Backfill(source_dsn, target_dsn, MIXED, cursor="id")
        builder = threading.Thread(target=lambda: built.append(other.build_key()))
        builder.start()
        pg.wait_until(
            lambda: pg.fetch_one(
                target_dsn,
                "SELECT count(*) FROM pg_locks WHERE relation = 'public.mixed'::regclass"
                " AND mode = 'AccessExclusiveLock' AND NOT granted AND database ="
                " (SELECT oid FROM pg_database WHERE datname = current_database())",
            ) == 1,
            timeout=30, what="the key build waits for the open batch",
        )  # fmt: skip
        assert builder.is_alive() and key_state(target_dsn)[0] is False
        batch.commit()
    builder.join(30)
    other.close()
    assert built == [True] and key_state(target_dsn) == (True, 1, None)


def test_a_key_put_in_twice_by_hand_stops_the_key_build_changing_nothing_until_it_is_removed(
    source_dsn: str, target_dsn: str
) -> None:
    keyless_target(source_dsn, target_dsn, 3000)
    with loader(source_dsn, target_dsn, 1000) as job:
        assert len(list(job.batches(max_batches=2))) == 2
    pg.execute(target_dsn, "INSERT INTO public.mixed SELECT * FROM public.mixed WHERE id = 7")
    with loader(source_dsn, target_dsn, 1000) as job, pytest.raises(EngineError) as caught:
        job.build_key()
    error = caught.value
    assert error.code == "backfill_key_duplicated"
    assert "7 (2 rows)" in str(error) and error.next_actions
    has_key, indexes, comment = key_state(target_dsn)
    assert (has_key, indexes) == (False, 0) and comment is not None and comment.startswith(MARKER)
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM public.mixed") == 2001

    # A run of another orchestrator stops the same way, before it writes anything.
    other = Backfill(source_dsn, target_dsn, MIXED, cursor="id")
    with other, pytest.raises(EngineError, match="backfill_key_duplicated"):
        other.run()
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM public.mixed") == 2001

    pg.execute(
        target_dsn,
        "DELETE FROM public.mixed WHERE ctid = (SELECT max(ctid) FROM public.mixed WHERE id = 7)",
    )
    with Backfill(source_dsn, target_dsn, MIXED, cursor="id") as again:
        result = again.run()
    assert result.reconciliation is not None and result.reconciliation.ok
    assert key_state(target_dsn) == (True, 1, None)
    assert pg.table_fingerprint(source_dsn, "public", "mixed") == pg.table_fingerprint(
        target_dsn, "public", "mixed"
    )


def test_only_a_caller_that_asks_with_a_cursor_that_is_the_whole_key_defers_the_key(
    source_dsn: str, target_dsn: str
) -> None:
    pg.execute(
        source_dsn,
        "CREATE TABLE public.events (id bigint PRIMARY KEY, at timestamptz NOT NULL);"
        "CREATE INDEX ON public.events (at)",
    )
    events = TableName("public", "events")
    by_time = prepare_target(source_dsn, target_dsn, events, events, "at", defer_key=True)
    assert by_time.created and not by_time.deferred_key
    pg.create_mixed_table(source_dsn, rows=10)
    keyed = prepare_target(source_dsn, target_dsn, MIXED, MIXED, "id")  # defer_key off
    assert keyed.created and not keyed.deferred_key
    assert key_state(target_dsn) == (True, 1, None)
    found = pg.fetch_one(
        target_dsn,
        "SELECT count(*) FROM pg_index WHERE indrelid = 'public.events'::regclass AND indisprimary",
    )
    assert found == 1


ROWS = 60_000
BATCH = 2_000


@pytest.mark.parametrize("mode", ["copy", "commit", "committed", "timer", "key"])
def test_kill_9_during_a_keyless_load_then_a_resume_builds_the_key_and_loses_and_doubles_nothing(
    source_dsn: str, target_dsn: str, mode: str
) -> None:
    pg.create_mixed_table(source_dsn, rows=ROWS)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    proc = crash.start_child("backfill_keyless", source_dsn, target_dsn, BATCH)
    outcome = crash.kill_at(proc, mode, rng.randint(1, 5) if mode != "key" else 1, rng)
    assert outcome == "killed", (seed, outcome)
    with psycopg.connect(target_dsn) as conn:
        rows, copied = conn.execute(
            "SELECT (SELECT count(*) FROM public.mixed),"
            " (SELECT coalesce(sum(copied_count), 0) FROM dpone_ledger.backfill_batch_receipts)"
        ).fetchone() or (None, None)
    assert rows == copied, f"seed {seed}: the target holds {rows} rows, the receipts {copied}"
    if mode != "key":  # killed as it printed "key", it may have built the key already
        assert key_state(target_dsn)[0] is False, f"seed {seed}: killed before the key"

    final = crash.start_child("backfill_keyless", source_dsn, target_dsn, BATCH)
    out, _ = final.communicate(timeout=120)
    assert final.returncode == 0 and out.rstrip().endswith(f"done {ROWS}"), out
    assert key_state(target_dsn) == (True, 1, None)
    with Backfill(source_dsn, target_dsn, MIXED, cursor="id") as job:
        run = job.verify()  # the run's digest and every link of its checkpoint chain
    assert run.progress.copied_count == ROWS and run.progress.duplicate_count == 0
    assert pg.fetch_one(target_dsn, "SELECT count(DISTINCT id) FROM public.mixed") == ROWS
    assert pg.table_fingerprint(source_dsn, "public", "mixed") == pg.table_fingerprint(
        target_dsn, "public", "mixed"
    )
