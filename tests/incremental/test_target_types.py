"""The incremental stream's target brings the user-defined types its columns need (created with
the table in the first batch's transaction), gains the enum labels the source adds between runs,
and creates an extension only when named."""

from __future__ import annotations

import pytest

from dpone_dagster.incremental import IncrementalOptions, IncrementalSync
from dpone_dagster.postgres import TargetTypeError
from tests.helpers import pg
from tests.postgres.test_target_extensions import NOTES
from tests.postgres.test_target_types import DEFINITIONS, GAINED, ORDERS, TYPES

UNCHECKED = IncrementalOptions(reconcile=False)
"""The streams' options: the defaults but the check (these tests are about the target's types)."""


def _same_orders(source_dsn: str, target_dsn: str) -> bool:
    return pg.table_fingerprint(target_dsn, "Sales Ops", "orders") == pg.table_fingerprint(
        source_dsn, "Sales Ops", "orders"
    )


@pytest.mark.cross_server
def test_a_stream_creates_its_tables_types_and_adds_the_labels_the_source_gains(
    source_dsn: str, target_dsn: str
) -> None:
    pg.execute(source_dsn, TYPES)
    pg.execute(source_dsn, ORDERS)
    sync = IncrementalSync(source_dsn, target_dsn, '"Sales Ops".orders', cursor="id",
                           options=UNCHECKED)  # fmt: skip
    first = sync.run()
    assert [t.qualified for t in first.target_types.types] == [
        "Type Ops.Mood", "Type Ops.steady", "public.positive", "public.line_item",
        "public.price_range",
    ]  # fmt: skip
    assert pg.fetch_all(target_dsn, DEFINITIONS) == pg.fetch_all(source_dsn, DEFINITIONS)
    assert _same_orders(source_dsn, target_dsn)

    for statement in GAINED.strip().splitlines():
        pg.execute(source_dsn, statement)
    pg.execute(
        source_dsn,
        """INSERT INTO "Sales Ops".orders (id, mood, steady)
                              VALUES (3, 'meh', 'great')""",
    )
    second = sync.run()
    assert [label.describe() for label in second.target_types.labels] == [
        "Type Ops.Mood: 'meh' before 'ok'", "Type Ops.Mood: 'great' at the end",
    ]  # fmt: skip
    assert second.target_types.types == ()
    assert pg.fetch_all(target_dsn, DEFINITIONS) == pg.fetch_all(source_dsn, DEFINITIONS)
    assert _same_orders(source_dsn, target_dsn)


@pytest.mark.cross_server
def test_a_stream_creates_an_extension_only_when_named(source_dsn: str, target_dsn: str) -> None:
    pg.execute(source_dsn, NOTES)
    with pytest.raises(TargetTypeError) as caught:
        IncrementalSync(source_dsn, target_dsn, "public.notes", cursor="id",
                        options=UNCHECKED).run()  # fmt: skip
    assert caught.value.code == "target_extension_missing"
    assert not pg.table_exists(target_dsn, "public", "notes")
    named = IncrementalSync(
        source_dsn, target_dsn, "public.notes", cursor="id", options=UNCHECKED,
        create_extensions=["hstore", "citext"],
    ).run()  # fmt: skip
    assert [e.name for e in named.target_types.extensions] == ["citext", "hstore"]
    assert pg.table_fingerprint(target_dsn, "public", "notes") == pg.table_fingerprint(
        source_dsn, "public", "notes"
    )
