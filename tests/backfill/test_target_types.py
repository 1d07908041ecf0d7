"""The backfill's missing target brings the user-defined types its columns need, as a snapshot
copy's does (tests/postgres/test_target_types.py): created with the table, in its transaction."""

from __future__ import annotations

import pytest

from dpone_dagster.backfill import Backfill, BackfillStatus, prepare_target
from dpone_dagster.postgres import TableName, TargetTypeError
from tests.helpers import pg
from tests.postgres.test_target_extensions import NOTES
from tests.postgres.test_target_types import DEFINITIONS, ORDERS, TYPES

ORDERS_TABLE = TableName("Sales Ops", "orders")


@pytest.mark.cross_server
def test_a_backfill_into_an_empty_database_creates_the_tables_types_with_it(
    source_dsn: str, target_dsn: str
) -> None:
    pg.execute(source_dsn, TYPES)
    pg.execute(source_dsn, ORDERS)
    prepared = prepare_target(source_dsn, target_dsn, ORDERS_TABLE, ORDERS_TABLE, "id")
    assert [t.qualified for t in prepared.target_types.types] == [
        "Type Ops.Mood", "Type Ops.steady", "public.positive", "public.line_item",
        "public.price_range",
    ]  # fmt: skip
    assert pg.fetch_all(target_dsn, DEFINITIONS) == pg.fetch_all(source_dsn, DEFINITIONS)
    result = Backfill(source_dsn, target_dsn, '"Sales Ops".orders', cursor="id").run()
    assert result.run.status is BackfillStatus.SUCCEEDED
    assert pg.table_fingerprint(target_dsn, "Sales Ops", "orders") == pg.table_fingerprint(
        source_dsn, "Sales Ops", "orders"
    )
    assert not prepare_target(source_dsn, target_dsn, ORDERS_TABLE, ORDERS_TABLE, "id")


@pytest.mark.cross_server
def test_a_backfill_creates_an_extension_only_when_named(source_dsn: str, target_dsn: str) -> None:
    pg.execute(source_dsn, NOTES)
    notes = TableName("public", "notes")
    with pytest.raises(TargetTypeError) as caught:
        prepare_target(source_dsn, target_dsn, notes, notes, "id")
    assert caught.value.code == "target_extension_missing"
    assert not pg.table_exists(target_dsn, "public", "notes")
    prepared = prepare_target(
        source_dsn, target_dsn, notes, notes, "id", create_extensions=["citext", "hstore"]
    )
    assert [e.name for e in prepared.target_types.extensions] == ["citext", "hstore"]
    Backfill(source_dsn, target_dsn, "public.notes", cursor="id").run()
    assert pg.table_fingerprint(target_dsn, "public", "notes") == pg.table_fingerprint(
        source_dsn, "public", "notes"
    )
