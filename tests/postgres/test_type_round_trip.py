"""Every column type the issue lists round-trips exactly, with every strategy, into a target
created from the source's definition."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from dpone_dagster.dagster.metadata.receipts import table_metadata
from dpone_dagster.postgres import TableName
from dpone_dagster.postgres.catalog import CatalogError, table_catalog, table_columns
from dpone_dagster.postgres.user_types import TargetTypeError
from dpone_dagster.snapshot_copy import SnapshotCopyOptions, copy_tables
from tests.helpers import pg

BUILT_IN = TableName("Sales Ops", 'Order "Items"')
USER_TYPES = TableName("public", "Moods")

_SCHEMA = '''
CREATE SCHEMA "Sales Ops";
CREATE TABLE "Sales Ops"."Order ""Items""" (
    "Id" bigint PRIMARY KEY,
    small smallint, num integer NOT NULL DEFAULT 7, amount numeric, price numeric(14,2),
    ratio double precision, label text DEFAULT 'none', code varchar(10), raw bytea,
    flag boolean, born date, seen timestamp, happened timestamptz, span interval, ref uuid,
    doc json, docb jsonb, ints integer[], words text[],
    "Upper Case" text, "with space" text, "quote""d" text, big text,
    doubled bigint GENERATED ALWAYS AS ("Id" * 2) STORED
);
INSERT INTO "Sales Ops"."Order ""Items""" VALUES
 (1, -32768, 2147483647, 'NaN', 12345678901.25, 'NaN'::float8, E'tab\\there\\nnew line \\\\ back',
  'ten chars!', '\\x00ff10', true, 'infinity', '2024-02-29 23:59:59.999999', 'infinity',
  '1 year 2 mons -3 days 04:05:06.789', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
  '{"b" :  1,   "a": [true, null]}', '{"b": 1, "a": [true, null]}', '{1,NULL,-3}',
  '{"with space","quote\\"d",NULL,"back\\\\slash"}', 'ÄÖÜ ß 🐘', 'x y', 'q"q',
  (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 40000) g)),
 (2, 0, -1, '-123.4560', -0.01, '-Infinity', '', '', '', false, '-infinity',
  '-infinity', '-infinity', '0', '00000000-0000-0000-0000-000000000000', 'null', '[]',
  '{}', '{}', '', '', '', ''),
 (3, NULL, DEFAULT, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
'''

_USER_TYPES = """
CREATE TYPE public."Mood" AS ENUM ('sad', 'ok', 'it''s "fine"');
CREATE DOMAIN public.positive AS integer CHECK (VALUE > 0);
"""

_USER_TABLE = """
CREATE TABLE public."Moods" (id int PRIMARY KEY, mood "Mood" DEFAULT 'ok', moods "Mood"[],
                             qty positive NOT NULL);
INSERT INTO public."Moods" VALUES (1, 'it''s "fine"', '{sad,"it''s \\"fine\\"",NULL}', 5),
                                  (2, NULL, NULL, 1);
"""


def _shape(dsn: str, table: TableName) -> tuple[list[tuple[object, ...]], list[str]]:
    with psycopg.connect(dsn) as conn:
        columns = [
            (c.name, c.type_sql, c.not_null, c.default_sql, c.generation_sql)
            for c in table_columns(conn, table)
        ]
        return columns, list(table_catalog(conn, table).key)  # type: ignore[return-value]


@pytest.mark.cross_server
@pytest.mark.parametrize(
    "strategy", ["whole_copy", "stream_rows", "batched_copy", "partitioned_copy", "internal_query"]
)
def test_every_type_round_trips_exactly_into_a_created_target(
    source_dsn: str, target_dsn: str, strategy: str
) -> None:
    for statement in (_SCHEMA, _USER_TYPES, _USER_TABLE):
        pg.execute(source_dsn, statement)
    internal = strategy == "internal_query"
    if internal:
        # One database: the copies go to other names, the types are already there.
        target_dsn = source_dsn
        pg.execute(source_dsn, 'CREATE SCHEMA "Copy Ops"')
        targets = [TableName("Copy Ops", BUILT_IN.name), TableName("Copy Ops", "Moods")]
    else:
        pg.execute(target_dsn, _USER_TYPES)
        targets = [BUILT_IN, USER_TYPES]
    toast = pg.fetch_one(
        source_dsn,
        sql.SQL(
            "SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE oid = {}::regclass"
        ).format(sql.Literal(BUILT_IN.qualified)),
    )
    assert int(toast) > 1_000_000, "the large value lives out of line, in TOAST"  # type: ignore[call-overload]

    report = copy_tables(
        source_dsn,
        target_dsn,
        [(BUILT_IN, targets[0]), (USER_TYPES, targets[1])],
        options=SnapshotCopyOptions(strategy=strategy, batch_size=2),  # type: ignore[arg-type]
    )

    assert report.outcome == "success"
    formats = [t.copy_format for t in report.tables]
    assert formats == ["binary", "text"] or internal, "binary unless a user type needs text"
    for source, target in zip([BUILT_IN, USER_TYPES], targets, strict=True):
        order = "Id" if source == BUILT_IN else "id"
        assert pg.table_fingerprint(
            source_dsn, source.schema, source.name, order
        ) == pg.table_fingerprint(target_dsn, target.schema, target.name, order)
        assert _shape(source_dsn, source) == _shape(target_dsn, target)
    doubled = sql.SQL('SELECT doubled FROM {} WHERE "Id" = 3').format(targets[0].ident)
    assert pg.fetch_one(target_dsn, doubled) == 6, "generated: computed by the target, not written"


@pytest.mark.cross_server
def test_under_freeze_a_target_without_the_user_defined_types_is_refused_and_gets_none(
    source_dsn: str, target_dsn: str
) -> None:
    pg.execute(source_dsn, _USER_TYPES)
    pg.execute(source_dsn, _USER_TABLE)
    with pytest.raises(TargetTypeError) as err:
        copy_tables(
            source_dsn,
            target_dsn,
            ['public."Moods"'],
            options=SnapshotCopyOptions(schema_changes="freeze"),
        )
    assert err.value.code == "target_type_missing"
    assert "public.Mood, public.positive" in err.value.message
    assert "schema_changes='freeze' creates nothing" in err.value.message
    assert any("schema_changes='evolve'" in action for action in err.value.next_actions)
    assert not pg.table_exists(target_dsn, "public", "Moods")
    types = "SELECT count(*) FROM pg_type WHERE typname IN ('Mood', 'positive')"
    assert pg.fetch_one(target_dsn, types) == 0


def test_a_user_type_the_package_does_not_create_is_named_with_why(
    source_dsn: str, target_dsn: str
) -> None:
    """A table's row type as a column type: the package creates no table for it."""
    pg.execute(source_dsn, "CREATE TABLE public.points (x int, y int)")
    pg.execute(source_dsn, "CREATE TABLE public.shapes (id int PRIMARY KEY, p public.points)")
    with pytest.raises(TargetTypeError) as err:
        copy_tables(source_dsn, target_dsn, ["public.shapes"])
    assert err.value.code == "target_type_missing"
    assert "public.points (a base type with functions of its own, or a table's row type)" in (
        err.value.message
    )
    assert not pg.table_exists(target_dsn, "public", "shapes")


def test_an_unknown_source_table_is_table_not_found_and_nothing_is_written(
    source_dsn: str, target_dsn: str
) -> None:
    pg.create_mixed_table(source_dsn, rows=5)
    with pytest.raises(CatalogError) as err:
        copy_tables(source_dsn, target_dsn, ["public.mixed", 'public."Mixed"'])
    assert err.value.code == "table_not_found"
    assert not pg.table_exists(target_dsn, "public", "mixed")
    assert pg.open_transactions(source_dsn) == pg.open_transactions(target_dsn) == []


_UNCERTIFIED = """
CREATE TABLE public.spans (id bigint PRIMARY KEY, words tsvector, seats int4range, host inet,
                           at time, label text);
INSERT INTO public.spans VALUES
 (1, 'a fat cat', '[3,7)', '192.168.0.1/24', '12:34:56.789', 'one'),
 (2, NULL, 'empty', '::1', '24:00', NULL);
"""


@pytest.mark.cross_server
@pytest.mark.parametrize("strategy", ["whole_copy", "partitioned_copy"])
def test_types_not_certified_across_major_versions_move_as_text_and_the_receipt_says_so(
    source_dsn: str, target_dsn: str, strategy: str
) -> None:
    pg.execute(source_dsn, _UNCERTIFIED)
    report = copy_tables(source_dsn, target_dsn, ["public.spans"], strategy=strategy)  # type: ignore[arg-type]
    table = report.tables[0]
    versions = (pg.server_version(source_dsn), pg.server_version(target_dsn))
    if versions[0] != versions[1]:
        assert table.copy_format == "text"
        assert table.copy_format_reason == (
            f"binary COPY of inet, int4range, time, tsvector is not certified from PostgreSQL "
            f"{versions[0]} to {versions[1]}"
        )
    else:
        assert (table.copy_format, table.copy_format_reason) == ("binary", None)
    metadata = table_metadata(report, table)
    assert metadata["dpone/copy_format"] == table.copy_format
    assert metadata.get("dpone/copy_format_reason") == table.copy_format_reason  # never ""
    assert pg.table_fingerprint(source_dsn, "public", "spans") == pg.table_fingerprint(
        target_dsn, "public", "spans"
    )
