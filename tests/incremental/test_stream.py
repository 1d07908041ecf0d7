"""Contract points 2-4 against a real server: the initial load, boundaries between batches and
runs, updates, and deletes (hard and soft)."""

from __future__ import annotations

import itertools

from dpone_dagster.incremental import IncrementalOptions, IncrementalSync
from dpone_dagster.lifecycle import SnapshotLabel
from tests.helpers import pg
from tests.incremental.conftest import Stream, insert_orders


def test_first_run_is_the_initial_load_in_batches_then_a_run_with_nothing_to_do(
    stream: Stream,
) -> None:
    first = stream.run()
    assert first.run == 1 and first.old_mark is None
    assert (first.rows, first.inserted, first.updated) == (2500, 2500, 0)
    assert first.batches == 3 and first.snapshot_label is SnapshotLabel.SEVERAL_SNAPSHOTS
    assert first.new_mark == str(pg.fetch_one(stream.source, "SELECT max(updated_at)::text"
                                              " FROM shop.orders"))  # fmt: skip
    assert first.lag_seconds is not None and first.lag_seconds >= 0
    stream.assert_equal()
    again = stream.run()
    assert again.run is None and again.rows == 0 and again.new_mark == first.new_mark


def test_equal_cursor_values_split_across_batches_and_runs_are_neither_lost_nor_doubled(
    stream: Stream,
) -> None:
    # Every row shares one cursor value: batches of 300 split the tie by key.
    pg.execute(stream.source, "UPDATE shop.orders SET updated_at = '2026-01-01 00:00:00+00'")
    first = stream.run(batch_size=300)
    assert (first.rows, first.inserted, first.batches) == (2500, 2500, 9)
    runs = [(r.after, r.last) for r in first.receipts]
    assert all(b[0] == a[1] for a, b in itertools.pairwise(runs))  # a chain
    assert {r.last.cursor for r in first.receipts if r.last} == {"2026-01-01 00:00:00+00"}
    stream.assert_equal()
    # A second tie, above the first: the next run reads it, and nothing of the first again.
    insert_orders(stream.source, 5001, 700)
    pg.execute(stream.source, "UPDATE shop.orders SET updated_at = '2026-01-02 00:00:00+00'"
                              " WHERE id > 5000 OR id <= 10")  # fmt: skip
    second = stream.run(batch_size=300)
    assert (second.rows, second.inserted, second.updated) == (710, 700, 10)
    assert second.old_mark == "2026-01-01 00:00:00+00"
    assert second.new_mark == "2026-01-02 00:00:00+00"
    stream.assert_equal()
    assert stream.run(batch_size=300).rows == 0


def test_updates_move_rows_forward_and_the_target_keeps_the_latest_state_once(
    stream: Stream,
) -> None:
    stream.run()
    for note in ("first", "second", "third"):  # the same rows updated three times
        pg.execute(stream.source, "UPDATE shop.orders SET note = %s, updated_at = now()"
                                  " WHERE id %% 50 = 0", (note,))  # fmt: skip
    result = stream.run()
    assert (result.rows, result.inserted, result.updated) == (50, 0, 50)
    stream.assert_equal()
    assert (
        pg.fetch_one(stream.target, "SELECT count(*) FROM shop.orders WHERE note = 'third'") == 50
    )
    # An update that changes nothing but the cursor is read, and the merge leaves the row be.
    pg.execute(stream.source, "UPDATE shop.orders SET updated_at = now() WHERE id = 7")
    touched = stream.run()
    assert (touched.rows, touched.updated) == (1, 1)
    stream.assert_equal()


def _mutate_for_deletes(source: str) -> None:
    pg.execute(source, "DELETE FROM shop.orders WHERE id %% 97 = 0")  # scattered
    pg.execute(source, "DELETE FROM shop.orders WHERE id BETWEEN 1000 AND 1499")  # a key range
    # Deleted, then a new row with the same key.
    pg.execute(source, "DELETE FROM shop.orders WHERE id IN (5, 6)")
    pg.execute(source, "INSERT INTO shop.orders (id, note) VALUES (5, 'reborn'), (6, 'reborn')")


def test_hard_deletes_scattered_a_whole_key_range_and_delete_then_reinsert(stream: Stream) -> None:
    stream.run(deletes="hard")
    _mutate_for_deletes(stream.source)
    result = stream.run(deletes="hard")
    gone = 500 + len([i for i in range(97, 2501, 97) if not 1000 <= i <= 1499])
    assert result.deleted == gone
    assert result.keys_compared < 2 * gone + 50  # keys cross the wire for differing ranges only
    assert (result.inserted, result.updated) == (0, 2)
    stream.assert_equal()
    assert pg.fetch_one(stream.target, "SELECT note FROM shop.orders WHERE id = 5") == "reborn"
    assert stream.run(deletes="hard").deleted == 0


def test_hard_deletes_are_exact_whatever_the_key_histogram_says(stream: Stream) -> None:
    # The range counts split the keys at the source's histogram (pg_stats): taken here, then
    # made stale by sparse keys far above it; the deletes found must not depend on it.
    pg.execute(stream.source, "ANALYZE shop.orders")
    assert pg.fetch_one(stream.source, "SELECT histogram_bounds IS NOT NULL FROM pg_stats"
                        " WHERE tablename = 'orders' AND attname = 'id'")  # fmt: skip
    for first in range(10_000_000, 10_100_000, 1000):
        insert_orders(stream.source, first, 3)
    stream.run(deletes="hard")
    chosen = "mod(id, 101) = 0 OR id IN (1, 2500, 10000001, 10050000, 10099002)"
    gone = pg.fetch_one(stream.source, f"SELECT count(*) FROM shop.orders WHERE {chosen}")
    assert isinstance(gone, int) and gone > 30
    pg.execute(stream.source, f"DELETE FROM shop.orders WHERE {chosen}")
    result = stream.run(deletes="hard")
    assert result.deleted == gone
    assert result.keys_compared < 40 * gone  # only the differing ranges' keys cross the wire
    stream.assert_equal()
    assert stream.run(deletes="hard").deleted == 0


def test_soft_deletes_mark_rows_with_a_created_column_and_a_returning_key_clears_it(
    stream: Stream,
) -> None:
    stream.run(deletes="soft")
    _mutate_for_deletes(stream.source)
    result = stream.run(deletes="soft")
    marked = pg.fetch_one(stream.target, "SELECT count(*) FROM shop.orders"
                                         " WHERE _dpone_deleted_at IS NOT NULL")  # fmt: skip
    assert marked == result.deleted > 500
    stream.assert_equal(live="_dpone_deleted_at IS NULL")
    assert pg.fetch_one(stream.target, "SELECT count(*) FROM shop.orders") == 2500
    # A marked key arrives again: the merge brings its values and the mark is cleared.
    pg.execute(stream.source, "INSERT INTO shop.orders (id, note) VALUES (1200, 'back')")
    back = stream.run(deletes="soft")
    assert back.deleted == 0
    assert pg.fetch_one(stream.target, "SELECT _dpone_deleted_at IS NULL AND note = 'back'"
                                       " FROM shop.orders WHERE id = 1200")  # fmt: skip
    stream.assert_equal(live="_dpone_deleted_at IS NULL")


def test_ignore_keeps_deleted_rows_and_the_state_is_one_small_row_per_stream(
    stream: Stream,
) -> None:
    stream.run(batch_size=100)
    pg.execute(stream.source, "DELETE FROM shop.orders WHERE id <= 100")
    insert_orders(stream.source, 9001, 1000)
    stream.run(batch_size=100)
    assert pg.fetch_one(stream.target, "SELECT count(*) FROM shop.orders") == 3500
    assert pg.fetch_one(stream.target, "SELECT count(*) FROM dpone_ledger.incremental_streams") == 1
    size = pg.fetch_one(stream.target, "SELECT pg_column_size(state_json)"
                                       " FROM dpone_ledger.incremental_streams")  # fmt: skip
    assert isinstance(size, int) and size < 1000  # O(1): 36 batches later, no list grows
    receipts = pg.fetch_one(
        stream.target, "SELECT count(*) FROM dpone_ledger.incremental_batch_receipts"
    )
    assert receipts == 26 + 11


def test_a_verified_run_proves_the_target_and_catches_a_row_it_lacks(stream: Stream) -> None:
    first = stream.run(reconcile=True, check="full", deletes="hard")
    assert first.verification is not None and first.verification.ok
    assert first.verification.keys_compared == 0
    pg.execute(stream.source, "DELETE FROM shop.orders WHERE id = 3")
    pg.execute(stream.source, "UPDATE shop.orders SET note = 'v', updated_at = now() WHERE id = 4")
    # Damage the replica behind the stream's back: a row lost, a row changed.
    pg.execute(stream.target, "DELETE FROM shop.orders WHERE id = 8")
    pg.execute(stream.target, "UPDATE shop.orders SET note = 'tampered' WHERE id = 9")
    second = stream.run(reconcile=True, check="full", deletes="hard")
    assert second.deleted == 1
    check = second.verification
    assert check is not None and not check.ok
    assert check.unexplained == 2 and set(check.examples) == {("8",), ("9",)}
    assert check.keys_compared < 10


def test_a_batch_checkpoint_is_its_greatest_cursor_in_the_cursor_type_order(
    source_dsn: str, target_dsn: str
) -> None:
    # As text, '9' sorts after '10' and '-1' after '-20': a checkpoint taken in text order
    # would sit below the batch's last row, and the next batch would read rows again.
    pg.execute(
        source_dsn,
        "CREATE SCHEMA shop; CREATE TABLE shop.ticks (id int PRIMARY KEY, seq bigint NOT NULL,"
        " at numeric NOT NULL); CREATE INDEX ON shop.ticks (seq); CREATE INDEX ON shop.ticks (at);"
        " INSERT INTO shop.ticks SELECT g, g - 21, (g - 21) * 0.5 FROM generate_series(1, 40) g",
    )
    for cursor in ("seq", "at"):
        sync = IncrementalSync(
            source_dsn, target_dsn, "shop.ticks", cursor=cursor,
            target_table=f"shop.ticks_{cursor}",
            options=IncrementalOptions(batch_size=10, reconcile=False),
        )  # fmt: skip
        result = sync.run()
        lasts = [r.last.cursor for r in result.receipts if r.last]
        query = f"SELECT {cursor}::text FROM shop.ticks WHERE id %% 10 = 0 ORDER BY id"
        assert lasts == [str(r[0]) for r in pg.fetch_all(source_dsn, query)], cursor
        assert (result.rows, result.inserted, result.updated) == (40, 40, 0), cursor


def test_an_initial_load_into_a_target_holding_some_keys_merges_them(stream: Stream) -> None:
    # The initial load tries a plain INSERT per batch; a key already in the target undoes the
    # attempt (a savepoint) and the batch merges instead: same rows, same counts.
    pg.execute(stream.target, "CREATE SCHEMA shop")
    pg.execute(stream.target, "CREATE TABLE shop.orders (id bigint PRIMARY KEY,"
               " updated_at timestamptz NOT NULL, note text, amount numeric(12, 2))")  # fmt: skip
    pg.execute(stream.target, "INSERT INTO shop.orders VALUES (1, now(), 'stale', 0),"
               " (1500, now(), 'stale', 0)")  # fmt: skip
    same = pg.fetch_all(stream.source, "SELECT * FROM shop.orders WHERE id = 2000")
    pg.execute(stream.target, "INSERT INTO shop.orders VALUES (%s, %s, %s, %s)", same[0])
    first = stream.run()
    assert (first.rows, first.inserted, first.updated, first.batches) == (2500, 2497, 2, 3)
    stream.assert_equal()


def _pages(dsn: str, table: str, keys: str) -> dict[int, int]:
    """``{key: heap page}`` of the rows ``keys`` selects."""
    query = f"SELECT id, (ctid::text::point)[0]::int FROM {table} WHERE {keys}"
    return {int(k): int(p) for k, p in pg.fetch_all(dsn, query)}  # type: ignore[call-overload]


def test_a_target_the_stream_creates_leaves_room_so_updated_rows_stay_on_their_pages(
    stream: Stream,
) -> None:
    stream.run()
    packed = stream.sync(target_table="shop.orders_packed", fillfactor=100)
    packed.run()
    options = "SELECT reloptions FROM pg_class WHERE oid = %s::regclass"
    assert pg.fetch_one(stream.target, options, ("shop.orders",)) == ["fillfactor=90"]
    assert pg.fetch_one(stream.target, options, ("shop.orders_packed",)) is None
    spread = "id %% 50 = 0"
    before = {t: _pages(stream.target, t, spread) for t in ("shop.orders", "shop.orders_packed")}
    pg.execute(stream.source, f"UPDATE shop.orders SET note = 'moved', updated_at = now()"
                              f" WHERE {spread}")  # fmt: skip
    assert stream.run().updated == 50
    assert packed.run().updated == 50
    stream.assert_equal()
    # The room each page kept takes the new row versions: an update on its page (HOT) adds
    # no index entry. Full pages send them elsewhere.
    assert _pages(stream.target, "shop.orders", spread) == before["shop.orders"]
    moved = _pages(stream.target, "shop.orders_packed", spread)
    assert sum(moved[k] != p for k, p in before["shop.orders_packed"].items()) > 25


def test_an_existing_target_keeps_its_own_storage_options(stream: Stream) -> None:
    pg.execute(stream.target, "CREATE SCHEMA shop")
    pg.execute(stream.target, "CREATE TABLE shop.orders (id bigint PRIMARY KEY,"
               " updated_at timestamptz NOT NULL, note text, amount numeric(12, 2))"
               " WITH (fillfactor = 70)")  # fmt: skip
    stream.run(fillfactor=50)
    options = "SELECT reloptions FROM pg_class WHERE oid = 'shop.orders'::regclass"
    assert pg.fetch_one(stream.target, options) == ["fillfactor=70"]
    stream.assert_equal()
