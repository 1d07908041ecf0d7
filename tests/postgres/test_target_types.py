"""A table copied into a database that lacks its user-defined types brings them: enums, domains,
composite and range types and arrays of them, in dependency order, in the load's transaction;
a type the target has otherwise is refused; an enum label the source gained is added under
``evolve``; ``freeze`` creates nothing."""

from __future__ import annotations

import pytest

from dpone_dagster.dagster.metadata.receipts import table_metadata
from dpone_dagster.lifecycle import TerminalOutcome
from dpone_dagster.postgres import SchemaChangeError
from dpone_dagster.postgres.user_types import TargetTypeError
from dpone_dagster.snapshot_copy import CopyError, SnapshotCopyOptions, copy_tables
from tests.helpers import locks, pg

TYPES = """
CREATE SCHEMA "Type Ops";
CREATE TYPE "Type Ops"."Mood" AS ENUM ('sad', 'ok', 'it''s "fine"');
CREATE DOMAIN "Type Ops".steady AS "Type Ops"."Mood" NOT NULL DEFAULT 'ok'
    CHECK (VALUE <> 'sad');
CREATE DOMAIN public.positive AS numeric(10,2) DEFAULT 1
    CONSTRAINT above_zero CHECK (VALUE > 0) CONSTRAINT below_a_million CHECK (VALUE < 1000000);
CREATE TYPE public.line_item AS (sku text, qty public.positive, mood "Type Ops".steady);
CREATE TYPE public.price_range AS RANGE (subtype = float8, subtype_diff = float8mi);
"""

ORDERS = """
CREATE SCHEMA "Sales Ops";
CREATE TABLE "Sales Ops".orders (
    id bigint PRIMARY KEY,
    mood "Type Ops"."Mood",
    moods "Type Ops"."Mood"[],
    steady "Type Ops".steady,
    items public.line_item[],
    item public.line_item,
    band public.price_range,
    bands public.price_multirange,
    qty public.positive
);
INSERT INTO "Sales Ops".orders VALUES
 (1, 'it''s "fine"', '{sad,ok,"it''s \\"fine\\""}', 'it''s "fine"',
  ARRAY[ROW('a', 1.5, 'ok')::public.line_item, ROW('b"c', 2, 'it''s "fine"')::public.line_item],
  ROW('x', 3, 'ok'), '[1.5,2.5)', '{[1,2), [3,4)}', 42),
 (2, NULL, NULL, DEFAULT, '{}', NULL, 'empty', '{}', NULL);
"""

# Every user-defined type of a database as its catalog defines it, read independently of the
# package: kind, base type, NOT NULL, default, checks (PostgreSQL 17 and later list a domain's
# NOT NULL there too: typnotnull says it), labels, attributes, range subtype.
DEFINITIONS = """
SELECT n.nspname, t.typname, t.typtype, format_type(t.typbasetype, t.typtypmod), t.typnotnull,
       pg_get_expr(t.typdefaultbin, 0),
       ARRAY(SELECT pg_get_constraintdef(k.oid) || ' ' || k.conname FROM pg_constraint k
             WHERE k.contypid = t.oid AND k.contype = 'c' ORDER BY k.conname),
       ARRAY(SELECT enumlabel::text FROM pg_enum WHERE enumtypid = t.oid ORDER BY enumsortorder),
       ARRAY(SELECT a.attname || ' ' || format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
             WHERE a.attrelid = t.typrelid AND t.typtype = 'c' ORDER BY a.attnum),
       (SELECT format_type(r.rngsubtype, NULL) || ' ' || r.rngsubdiff::text FROM pg_range r
        WHERE r.rngtypid = t.oid)
FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
WHERE n.nspname IN ('public', 'Type Ops') AND t.typtype IN ('e', 'd', 'c', 'r', 'm')
  AND (t.typtype <> 'c' OR (SELECT relkind FROM pg_class WHERE oid = t.typrelid) = 'c')
ORDER BY 1, 2
"""


def _definitions(dsn: str) -> list[tuple[object, ...]]:
    return pg.fetch_all(dsn, DEFINITIONS)


def _orders(dsn: str) -> tuple[int, str]:
    return pg.table_fingerprint(dsn, "Sales Ops", "orders")


def _source(source_dsn: str) -> None:
    pg.execute(source_dsn, TYPES)
    pg.execute(source_dsn, ORDERS)


@pytest.mark.cross_server
@pytest.mark.parametrize("strategy", ["batched_copy", "stream_rows"])
def test_a_created_target_brings_its_types_in_dependency_order_in_the_tables_transaction(
    source_dsn: str, target_dsn: str, strategy: str
) -> None:
    _source(source_dsn)
    report = copy_tables(source_dsn, target_dsn, ['"Sales Ops".orders'], strategy=strategy)  # type: ignore[arg-type]

    assert report.outcome is TerminalOutcome.SUCCESS
    assert _definitions(target_dsn) == _definitions(source_dsn)
    assert _orders(target_dsn) == _orders(source_dsn)
    created = table_metadata(report, report.tables[0])["dpone/types_created"].data
    assert [(t["type"], t["kind"]) for t in created] == [
        ("Type Ops.Mood", "enum"), ("Type Ops.steady", "domain"), ("public.positive", "domain"),
        ("public.line_item", "composite"), ("public.price_range", "range"),
    ], "each after what it names"  # fmt: skip
    # One transaction: each created type's catalog row was written by the table's.
    writers = pg.fetch_all(
        target_dsn,
        "SELECT DISTINCT t.xmin::text FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace"
        " WHERE n.nspname IN ('public', 'Type Ops') UNION SELECT xmin::text FROM pg_class"
        " WHERE oid = '\"Sales Ops\".orders'::regclass",
    )
    assert len(writers) == 1, "the types and the table commit together"
    inserted = 'INSERT INTO "Sales Ops".orders (id, steady) VALUES (3, %s)'
    with pytest.raises(Exception, match="steady_check"):  # the domain's check came along
        pg.execute(target_dsn, inserted, ("sad",))

    again = copy_tables(source_dsn, target_dsn, ['"Sales Ops".orders'], sink="merge")
    assert again.outcome is TerminalOutcome.SUCCESS, "the created types equal the source's"
    assert _orders(target_dsn) == _orders(source_dsn)


@pytest.mark.cross_server
def test_a_load_that_fails_after_creating_the_types_leaves_none(
    source_dsn: str, target_dsn: str
) -> None:
    _source(source_dsn)
    before = _definitions(target_dsn)
    gate = locks.terminated_at_gate(source_dsn, "dpone-dagster", "")
    with gate as held, pytest.raises(CopyError) as caught:
        held.create_view("public.gated", "Sales Ops.orders")
        copy_tables(
            source_dsn, target_dsn, [("public.gated", '"Sales Ops".orders')],
            strategy="stream_rows",
        )  # fmt: skip
    report = caught.value.report
    assert report is not None and report.outcome is TerminalOutcome.ABORT
    assert _definitions(target_dsn) == before
    assert not pg.table_exists(target_dsn, "Sales Ops", "orders")


DIFFERENT = [
    (
        'CREATE SCHEMA "Type Ops"; CREATE TYPE "Type Ops"."Mood" AS ENUM (\'ok\', \'sad\')',
        "Type Ops.Mood: source enum ('sad', 'ok', 'it\\'s \"fine\"'); target enum ('ok', 'sad')",
    ),
    (
        "CREATE DOMAIN public.positive AS numeric(10,2) DEFAULT 1 CHECK (VALUE >= 0)",
        "public.positive: source domain over numeric(10,2) DEFAULT 1 CHECK ((VALUE > (0)::numeric))"
        " CHECK ((VALUE < (1000000)::numeric)); target domain over numeric(10,2) DEFAULT 1 "
        "CHECK ((VALUE >= (0)::numeric))",
    ),
    (
        "CREATE TYPE public.line_item AS (sku text, qty integer)",
        "public.line_item: source composite (sku text, qty public.positive, mood Type "
        "Ops.steady); target composite (sku text, qty integer)",
    ),
]


@pytest.mark.cross_server
@pytest.mark.parametrize(("existing", "named"), DIFFERENT)
def test_a_type_the_target_defines_otherwise_is_refused_naming_both_and_nothing_is_written(
    source_dsn: str, target_dsn: str, existing: str, named: str
) -> None:
    _source(source_dsn)
    pg.execute(target_dsn, existing)
    before = _definitions(target_dsn)
    with pytest.raises(TargetTypeError) as caught:
        copy_tables(source_dsn, target_dsn, ['"Sales Ops".orders'])
    assert caught.value.code == "target_type_differs"
    assert named in caught.value.message
    assert "Nothing was written" in caught.value.message and caught.value.next_actions
    assert _definitions(target_dsn) == before
    assert not pg.table_exists(target_dsn, "Sales Ops", "orders")


GAINED = """
ALTER TYPE "Type Ops"."Mood" ADD VALUE 'meh' BEFORE 'ok';
ALTER TYPE "Type Ops"."Mood" ADD VALUE 'great';
"""


def _labels(dsn: str) -> list[str]:
    row = pg.fetch_one(dsn, 'SELECT enum_range(NULL::"Type Ops"."Mood")::text[]')
    return list(row)  # type: ignore[call-overload]


@pytest.mark.cross_server
@pytest.mark.parametrize("sink", ["replace", "merge"])
def test_evolve_adds_the_enum_labels_the_source_gained_in_their_place(
    source_dsn: str, target_dsn: str, sink: str
) -> None:
    _source(source_dsn)
    copy_tables(source_dsn, target_dsn, ['"Sales Ops".orders'])
    for statement in GAINED.strip().splitlines():  # ADD VALUE: each in its own transaction
        pg.execute(source_dsn, statement)
    pg.execute(
        source_dsn,
        """INSERT INTO "Sales Ops".orders (id, mood, moods, steady)
                              VALUES (3, 'meh', '{great,meh}', 'great')""",
    )
    report = copy_tables(source_dsn, target_dsn, ['"Sales Ops".orders'], sink=sink)  # type: ignore[arg-type]
    assert report.outcome is TerminalOutcome.SUCCESS
    assert _labels(target_dsn) == _labels(source_dsn) == ["sad", "meh", "ok", 'it\'s "fine"',
                                                          "great"]  # fmt: skip
    assert _orders(target_dsn) == _orders(source_dsn)
    added = [label.describe() for label in report.tables[0].target_types.labels]
    assert added == ["Type Ops.Mood: 'meh' before 'ok'", "Type Ops.Mood: 'great' at the end"]
    assert table_metadata(report, report.tables[0])["dpone/enum_labels_added"].data == [
        {"type": "Type Ops.Mood", "label": "meh", "before": "ok"},
        {"type": "Type Ops.Mood", "label": "great", "before": None},
    ]


@pytest.mark.cross_server
def test_freeze_refuses_an_enum_label_the_target_lacks_and_adds_none(
    source_dsn: str, target_dsn: str
) -> None:
    _source(source_dsn)
    copy_tables(source_dsn, target_dsn, ['"Sales Ops".orders'])
    for statement in GAINED.strip().splitlines():
        pg.execute(source_dsn, statement)
    before = (_labels(target_dsn), _orders(target_dsn))
    with pytest.raises(SchemaChangeError) as caught:
        copy_tables(
            source_dsn, target_dsn, ['"Sales Ops".orders'],
            options=SnapshotCopyOptions(schema_changes="freeze"),
        )  # fmt: skip
    assert caught.value.code == "schema_change_incompatible"
    assert "Type Ops.Mood: 'meh' before 'ok'; Type Ops.Mood: 'great' at the end" in (
        caught.value.message
    )
    assert (_labels(target_dsn), _orders(target_dsn)) == before


@pytest.mark.cross_server
def test_an_existing_type_equal_to_the_sources_is_used_and_one_table_of_two_creates_it_once(
    source_dsn: str, target_dsn: str
) -> None:
    _source(source_dsn)
    pg.execute(source_dsn, 'CREATE TABLE public.moods (id int PRIMARY KEY, m "Type Ops".steady)')
    pg.execute(source_dsn, "INSERT INTO public.moods VALUES (1, 'ok')")
    mood = """CREATE TYPE "Type Ops"."Mood" AS ENUM ('sad', 'ok', 'it''s "fine"')"""
    pg.execute(target_dsn, 'CREATE SCHEMA "Type Ops"')
    pg.execute(target_dsn, mood)
    report = copy_tables(source_dsn, target_dsn, ['"Sales Ops".orders', "public.moods"])
    assert report.outcome is TerminalOutcome.SUCCESS
    assert _definitions(target_dsn) == _definitions(source_dsn)
    created = [[t.qualified for t in table.target_types.types] for table in report.tables]
    assert created == [
        ["Type Ops.steady", "public.positive", "public.line_item", "public.price_range"],
        ["Type Ops.steady"],
    ], "each table lists what it needed; the shared domain was created once"
    assert pg.table_fingerprint(target_dsn, "public", "moods") == pg.table_fingerprint(
        source_dsn, "public", "moods"
    )
