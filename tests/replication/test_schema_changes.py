"""Contract point 5 against real servers: a column added, widened or dropped at the source
follows the one schema-change policy, in the data's transaction; ``freeze`` and a lossy change
are refused with ``schema_change_incompatible`` and nothing of the run is applied (tables that
join or leave the group: ``test_group_changes.py``)."""

from __future__ import annotations

import pytest

from dpone_dagster.lifecycle import DponeError
from tests.helpers import pg
from tests.replication.group import Group


def _columns(dsn: str) -> list[tuple[object, ...]]:
    return pg.fetch_all(
        dsn,
        "SELECT column_name::text, data_type::text FROM"
        " information_schema.columns WHERE table_name = 't'"
        " ORDER BY ordinal_position",
    )


def test_added_widened_and_dropped_columns_evolve_with_the_data(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    pg.execute(src, "CREATE TABLE public.t (id int PRIMARY KEY, v varchar(5), gone text, n int)")
    pg.execute(src, "INSERT INTO public.t VALUES (1, 'a', 'g', 1)")
    group = Group(src, target_dsn, ("public.t",))
    group.run()
    pg.execute(src, "INSERT INTO public.t VALUES (2, 'b', 'g', 2)")
    pg.execute(
        src,
        "ALTER TABLE public.t ADD COLUMN extra text, ALTER COLUMN v TYPE varchar(50),"
        " ALTER COLUMN n TYPE bigint",
    )
    pg.execute(src, "INSERT INTO public.t VALUES (3, 'a much longer value', 'g', 3000000000, 'e')")
    pg.execute(src, "ALTER TABLE public.t DROP COLUMN gone")
    pg.execute(src, "INSERT INTO public.t VALUES (4, 'd', 4, 'f')")
    report = group.run()
    assert report.transactions == 5 - 2  # two inserts, and the ALTERs carry no rows
    kinds = {(c.column, c.kind) for c in report.tables[0].schema_changes}
    assert {("extra", "added"), ("v", "widened"), ("n", "widened"), ("gone", "kept")} <= kinds
    group.assert_equal(columns="id, v, n, extra")
    assert pg.fetch_all(target_dsn, "SELECT id, gone FROM public.t ORDER BY id") == [
        (1, "g"),
        (2, "g"),
        (3, "g"),
        (4, None),
    ]


def test_freeze_and_a_lossy_change_are_refused_and_nothing_is_applied(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    pg.execute(src, "CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    group = Group(src, target_dsn, ("public.t",))
    group.run(schema_changes="freeze")
    pg.execute(src, "INSERT INTO public.t VALUES (1, 'a')")
    pg.execute(src, "ALTER TABLE public.t ADD COLUMN extra int")
    pg.execute(src, "INSERT INTO public.t VALUES (2, 'b', 2)")
    with pytest.raises(DponeError) as err:
        group.run(schema_changes="freeze")
    assert err.value.code == "schema_change_incompatible"
    # The target transaction that met the change is rolled back whole (both source transactions).
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM public.t") == 0
    group.run()  # evolve takes it
    group.assert_equal()
    pg.execute(src, "ALTER TABLE public.t ALTER COLUMN v TYPE int USING length(v)")
    pg.execute(src, "INSERT INTO public.t VALUES (3, 3, 3)")
    with pytest.raises(DponeError) as err:
        group.run()
    assert err.value.code == "schema_change_incompatible"
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM public.t") == 2
