"""The target's row count kept in the ledger, against a real server: after every committed batch
(inserts, updates, hard and soft deletes, keys that arrive again, a ``kill -9`` between batches,
a backfill handed over, a ledger of an earlier release) the stream's count is the target's
``count(*)`` of live rows; a run that counts the whole target anyway re-bases it (writes behind
the stream's back included); a run with nothing to do reports the ledger's count unread."""

from __future__ import annotations

import random
from typing import Any

from dpone_dagster.backfill import Backfill, BackfillOptions, backfill_handoff, prepare_target
from dpone_dagster.core import LEDGER_VERSION
from dpone_dagster.incremental import BatchOutcome, IncrementalResult, Sweep
from dpone_dagster.postgres import TableName
from tests.helpers import crash, pg
from tests.incremental.conftest import ORDERS, Stream, insert_orders

SOFT = "_dpone_deleted_at IS NULL"
STORED = "SELECT target_rows FROM dpone_ledger.incremental_streams"


def live(stream: Stream, where: str = "true") -> int:
    """The target's ``count(*)`` of live rows."""
    return int(str(pg.fetch_one(stream.target, f"SELECT count(*) FROM shop.orders WHERE {where}")))


def counted_run(stream: Stream, where: str = "true", **options: Any) -> IncrementalResult:
    """One run; asserts that the state of every batch it committed, its report and the ledger
    hold the target's live rows as ``count(*)`` finds them (right after each commit)."""
    seen: list[tuple[int | None, int]] = []

    def on_batch(done: BatchOutcome) -> None:
        seen.append((done.state.target_rows, live(stream, where)))

    result = stream.run(on_batch=on_batch, **options)
    assert all(kept == counted for kept, counted in seen), seen
    assert result.target_rows == live(stream, where)
    assert pg.fetch_one(stream.target, STORED) == result.target_rows
    return result


def change(stream: Stream, round_: int) -> None:
    """Updates (100), deletes (25 or 26) and inserts (60) spread over the table."""
    pg.execute(stream.source, "UPDATE shop.orders SET note = %s, updated_at = now()"
                              " WHERE id %% 25 = %s", (f"u{round_}", round_))  # fmt: skip
    pg.execute(stream.source, "DELETE FROM shop.orders WHERE id %% 97 = %s", (round_,))
    insert_orders(stream.source, 100_000 + 100 * round_, 60, note="r")


def test_the_count_follows_inserts_and_updates_and_keeps_what_ignore_keeps(stream: Stream) -> None:
    first = counted_run(stream)
    assert (first.batches, first.target_rows) == (3, 2500)  # the first run's inserts
    for round_ in range(2):
        change(stream, round_)
        result = counted_run(stream, batch_size=100)
        assert result.batches == 2 and result.inserted == 60
    assert live(stream) > len(stream.source_rows())  # ignore keeps the deleted keys


def test_a_comparison_of_the_whole_target_re_bases_the_count(stream: Stream) -> None:
    counted_run(stream, deletes="hard")
    # Behind the stream's back: two rows gone and one the source never had. Adding up the
    # run's own writes would be off by two; the range counts that find the deletes (the extra
    # row) count the whole target.
    pg.execute(stream.target, "DELETE FROM shop.orders WHERE id IN (1500, 1600)")
    pg.execute(stream.target, "INSERT INTO shop.orders (id, updated_at) VALUES (-1, now())")
    pg.execute(stream.source, "UPDATE shop.orders SET updated_at = now() WHERE id %% 25 = 1")
    insert_orders(stream.source, 3000, 60)
    result = counted_run(stream, deletes="hard")  # one batch: its check's count is the state's
    assert (result.batches, result.inserted, result.deleted) == (1, 60, 1)
    # The full check's digests of both whole tables count it too.
    pg.execute(stream.target, "DELETE FROM shop.orders WHERE id = 4")
    pg.execute(stream.source, "DELETE FROM shop.orders WHERE id IN (1003, 2003)")
    result = counted_run(stream, deletes="hard", reconcile=True, check="full")
    assert result.deleted == 2 and result.verification is not None


def test_soft_deletes_and_keys_that_arrive_again_move_the_live_count(stream: Stream) -> None:
    counted_run(stream, deletes="soft")  # its final batch adds the soft-delete column
    pg.execute(stream.source, "DELETE FROM shop.orders WHERE id <= 40")
    assert counted_run(stream, SOFT, deletes="soft").deleted == 40
    # Ten deleted keys arrive again, then newer changes: the revived rows are in the run's first
    # batch, not its final one (whose key comparison re-bases the count).
    insert_orders(stream.source, 1, 10, note="again")
    pg.execute(stream.source, "UPDATE shop.orders SET updated_at = now() WHERE id > 2000")
    result = counted_run(stream, SOFT, deletes="soft", batch_size=100)
    assert result.batches == 6 and live(stream, SOFT) == 2470
    assert live(stream) == 2500  # the marked rows stay


def test_a_sweep_that_covers_the_key_in_one_run_re_bases_the_count(stream: Stream) -> None:
    counted_run(stream)
    pg.execute(stream.target, "DELETE FROM shop.orders WHERE id <= 3")  # behind its back
    insert_orders(stream.source, 5000, 5)
    # One slice of 10,000 rows holds the whole key: the run's slices count every target row.
    result = counted_run(stream, reconcile=True, sweep=Sweep(rows=10_000))
    assert result.verification is not None and result.verification.unexplained == 3


def _stored_view(target: str) -> tuple[object, int]:
    """In ONE snapshot: the stream's stored count and the target's ``count(*)``."""
    row = pg.fetch_all(target, f"SELECT ({STORED}), (SELECT count(*) FROM shop.orders)")[0]
    return row[0], int(str(row[1]))


def test_a_kill_between_batches_leaves_the_count_of_what_committed(
    source_dsn: str, target_dsn: str
) -> None:
    pg.execute(source_dsn, ORDERS)
    insert_orders(source_dsn, 1, 20_000)
    stream = Stream(source_dsn, target_dsn)
    rng = random.Random(5)
    for round_, (mode, nth) in enumerate([("committed", 2), ("commit", 3), ("apply", 2)]):
        if round_:
            change(stream, round_)
        proc = crash.start_child("incremental", source_dsn, target_dsn, 1000)
        assert crash.kill_at(proc, mode, nth, rng, inside_copy=0.005) == "killed"
        stored, target = _stored_view(target_dsn)
        assert stored == target, (mode, stored, target)
    counted_run(stream, deletes="hard")  # ends the run the kills left
    counted_run(stream, deletes="hard")  # the changes after its mark
    stream.assert_equal()


def test_a_stream_that_continues_a_backfill_counts_its_target_once(stream: Stream) -> None:
    table = TableName("shop", "orders")
    prepare_target(stream.source, stream.target, table, table, "updated_at")
    with Backfill(stream.source, stream.target, "shop.orders", cursor="updated_at",
                  options=BackfillOptions(batch_size=1000)) as backfill:  # fmt: skip
        backfill.run()
    insert_orders(stream.source, 3000, 25)
    result = counted_run(stream, handoff=backfill_handoff)
    assert (result.rows, result.inserted, result.target_rows) == (25, 25, 2525)


def test_a_ledger_of_an_earlier_release_gets_the_count_on_its_next_run(stream: Stream) -> None:
    counted_run(stream)
    # The ledger as the release before the count left it: no count column, version 6.
    pg.execute(stream.target, "ALTER TABLE dpone_ledger.incremental_streams DROP target_rows;"
               " DELETE FROM dpone_ledger.ledger_version WHERE version >= 7")  # fmt: skip
    verification = stream.sync(reconcile=True).check()  # reads the ledger as it is
    assert verification is not None and verification.ok
    insert_orders(stream.source, 3000, 10)
    result = counted_run(stream)  # the ledger brought up to date, the target counted once
    assert (result.inserted, result.target_rows) == (10, 2510)
    version = "SELECT max(version) FROM dpone_ledger.ledger_version"
    assert pg.fetch_one(stream.target, version) == LEDGER_VERSION
    # From then on the ledger's count is the report's: a run with nothing to do reads nothing.
    pg.execute(stream.target, "UPDATE dpone_ledger.incremental_streams SET target_rows = 7")
    assert stream.run().target_rows == 7
