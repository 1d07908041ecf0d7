"""Contract point 6 against a real server: a stream that cannot run is refused with a stable code
when the run is planned, and nothing is written (no target table, no ledger)."""

from __future__ import annotations

import pytest

from dpone_dagster.backfill import Backfill, BackfillOptions, backfill_handoff, prepare_target
from dpone_dagster.core import EngineError
from dpone_dagster.cursor.handoff import Handoff
from dpone_dagster.incremental import IncrementalOptions, IncrementalSync
from dpone_dagster.postgres import TableName
from tests.helpers import pg
from tests.incremental.conftest import Stream


def _refused(
    stream: Stream, code: str, table: str = "shop.orders", cursor: str = "updated_at",
    handoff: Handoff | None = None, **options: object,
) -> EngineError:  # fmt: skip
    with pytest.raises(EngineError) as info:
        IncrementalSync(stream.source, stream.target, table, cursor=cursor, handoff=handoff,
                        options=IncrementalOptions(reconcile=False, **options)).run()  # fmt: skip
    assert info.value.code == code, info.value
    assert info.value.next_actions
    if pg.table_exists(stream.target, "dpone_ledger", "incremental_streams"):
        states = "SELECT count(*) FROM dpone_ledger.incremental_streams"
        assert pg.fetch_one(stream.target, states) == 0
    return info.value


def _target_rows(stream: Stream) -> int:
    if not pg.table_exists(stream.target, "shop", "orders"):
        return -1
    return int(pg.fetch_one(stream.target, "SELECT count(*) FROM shop.orders"))  # type: ignore[call-overload]


def test_a_table_without_a_primary_key_is_refused(stream: Stream) -> None:
    pg.execute(stream.source, "CREATE TABLE shop.nokey AS SELECT * FROM shop.orders")
    pg.execute(stream.source, "CREATE INDEX ON shop.nokey (updated_at)")
    _refused(stream, "incremental_primary_key_missing", table="shop.nokey")
    assert not pg.table_exists(stream.target, "shop", "nokey")


def test_a_cursor_without_an_index_is_refused(stream: Stream) -> None:
    pg.execute(stream.source, "DROP INDEX shop.orders_updated_at")
    _refused(stream, "incremental_cursor_unindexed")
    assert _target_rows(stream) == -1


def test_a_cursor_with_nulls_is_refused(stream: Stream) -> None:
    pg.execute(stream.source, "ALTER TABLE shop.orders ALTER updated_at DROP NOT NULL")
    pg.execute(stream.source, "UPDATE shop.orders SET updated_at = NULL WHERE id = 7")
    _refused(stream, "incremental_cursor_null")
    assert _target_rows(stream) == -1


def test_a_target_whose_key_differs_is_refused(stream: Stream) -> None:
    pg.execute(stream.target, "CREATE SCHEMA shop; CREATE TABLE shop.orders (id bigint,"
                              " updated_at timestamptz, note text, amount numeric(12,2),"
                              " PRIMARY KEY (id, updated_at))")  # fmt: skip
    _refused(stream, "incremental_target_key_differs")
    assert _target_rows(stream) == 0


def test_a_missing_or_unorderable_cursor_and_bad_options_are_refused(stream: Stream) -> None:
    _refused(stream, "cursor_not_found", cursor="nope")
    _refused(stream, "incremental_cursor_invalid", cursor="note")
    with pytest.raises(EngineError) as info:
        IncrementalOptions(deletes="all")
    assert info.value.code == "incremental_options_invalid"
    _refused(stream, "incremental_options_invalid", deletes="soft", soft_delete_column="note")
    for fillfactor in (5, 101, 90.5, True):
        with pytest.raises(EngineError) as info:
            stream.sync(fillfactor=fillfactor)
        assert info.value.code == "incremental_options_invalid"
        assert "fillfactor" in str(info.value) and info.value.next_actions
    assert _target_rows(stream) == -1


def test_continuing_from_a_backfill_that_is_missing_or_incomplete_is_refused(
    stream: Stream,
) -> None:
    error = _refused(stream, "incremental_backfill_incomplete", handoff=backfill_handoff)
    assert "no backfill" in error.message


def _backfill(stream: Stream, **kwargs: object) -> Backfill:
    table = TableName("shop", "orders")
    prepare_target(stream.source, stream.target, table, table, "updated_at")
    return Backfill(stream.source, stream.target, "shop.orders", cursor="updated_at",
                    options=BackfillOptions(batch_size=1000), **kwargs)  # type: ignore[arg-type]  # fmt: skip


def test_a_planned_but_unfinished_backfill_is_refused(stream: Stream) -> None:
    with _backfill(stream) as backfill:
        backfill.plan()
    error = _refused(stream, "incremental_backfill_incomplete", handoff=backfill_handoff)
    assert "not succeeded" in error.message
    assert _target_rows(stream) == 0


@pytest.mark.parametrize(
    "how",
    [{"handoff": backfill_handoff}, {"continue_from_backfill": True}],
    ids=["handoff", "option"],
)
def test_a_stream_continues_from_a_complete_backfill_without_copying_it_again(
    stream: Stream, how: dict[str, object]
) -> None:
    # The engine's own option, or the handoff given: the same engine's next policy.
    with _backfill(stream) as backfill:
        done = backfill.run()
    mark = done.run.boundary.source_high_water_mark
    pg.execute(stream.source, "UPDATE shop.orders SET updated_at = now() WHERE id <= 10")
    result = stream.run(deletes="hard", **how)
    assert result.old_mark == mark
    assert (result.rows, result.updated, result.inserted, result.deleted) == (10, 10, 0, 0)
    stream.assert_equal()
