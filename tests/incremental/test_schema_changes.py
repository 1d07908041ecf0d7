"""The incremental sync and schema changes: a source column added, widened or dropped between
runs evolves the target in a batch's transaction; ``freeze`` refuses before the run begins."""

from __future__ import annotations

import pytest

from dpone_dagster.incremental import IncrementalOptions
from dpone_dagster.postgres.schema_change import SchemaChangeError
from tests.helpers import pg
from tests.incremental.conftest import Stream, insert_orders

STATE = "SELECT state_json FROM dpone_ledger.incremental_streams"


def test_a_column_added_widened_and_dropped_between_runs_evolves_the_target(
    stream: Stream,
) -> None:
    stream.run(deletes="soft")
    pg.execute(
        stream.source,
        "ALTER TABLE shop.orders ADD channel text NOT NULL DEFAULT 'web',"
        " ALTER amount TYPE numeric(16,2), DROP note;"
        " UPDATE shop.orders SET channel = 'shop', amount = 12345678901234.50, updated_at = now()"
        " WHERE id <= 10",
    )
    insert_orders_without_note(stream.source, 2501, 5)
    second = stream.run(deletes="soft", batch_size=4)  # several batches: each change once
    changes = {c.column: (c.kind, c.before, c.after) for c in second.schema_changes}
    assert changes == {
        "channel": ("added", None, "text DEFAULT 'web'::text"),
        "amount": ("widened", "numeric(12,2)", "numeric(16,2)"),
        "note": ("kept", "text", "text"),
    }  # the stream's own soft-delete column is no dropped source column
    assert (second.rows, second.inserted, second.updated) == (15, 5, 10)
    stream.assert_equal(live="_dpone_deleted_at IS NULL")
    assert pg.fetch_all(
        stream.target, "SELECT count(*) FILTER (WHERE note IS NULL) FROM shop.orders"
    ) == [(5,)]  # new rows: the kept column is NULL; the older rows keep their notes
    # The next run: nothing to change; the dropped column is still reported as kept.
    assert [c.kind for c in stream.run(deletes="soft").schema_changes] == ["kept"]


def insert_orders_without_note(dsn: str, first: int, count: int) -> None:
    pg.execute(
        dsn,
        "INSERT INTO shop.orders (id, amount) SELECT g, g * 1.25"
        " FROM generate_series(%s::bigint, %s::bigint) g",
        (first, first + count - 1),
    )


def test_freeze_refuses_a_changed_source_before_the_run_begins(stream: Stream) -> None:
    stream.run(schema_changes="freeze")
    state = pg.fetch_all(stream.target, STATE)
    rows = pg.table_fingerprint(stream.target, "shop", "orders")
    pg.execute(stream.source, "ALTER TABLE shop.orders ADD channel text")
    insert_orders(stream.source, 2501, 5)
    with pytest.raises(SchemaChangeError) as caught:
        stream.run(schema_changes="freeze")
    assert caught.value.code == "schema_change_incompatible"
    assert "added 'channel' text" in caught.value.message
    assert pg.fetch_all(stream.target, STATE) == state  # no run begun
    assert pg.table_fingerprint(stream.target, "shop", "orders") == rows
    with pytest.raises(SchemaChangeError):
        IncrementalOptions(schema_changes="thaw")


def test_a_column_added_between_two_batches_of_a_run_evolves_with_the_next_batch(
    stream: Stream,
) -> None:
    def add_a_column_once(done: object) -> None:
        if not seen:
            pg.execute(stream.source, "ALTER TABLE shop.orders ADD channel text DEFAULT 'web'")
        seen.append(done)

    seen: list[object] = []
    result = stream.run(on_batch=add_a_column_once)  # 2,500 rows in batches of 1,000
    assert result.batches == 3
    [change] = result.schema_changes
    assert (change.column, change.kind) == ("channel", "added")
    stream.assert_equal()
