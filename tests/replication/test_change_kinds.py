"""Contract point 4 against real servers: every change kind (insert, update, a key change,
delete hard and soft, TRUNCATE, an unchanged TOASTed value under REPLICA IDENTITY DEFAULT) and
the hostile types round-trip exactly; a table the slot cannot name is refused at plan time."""

from __future__ import annotations

import psycopg
import pytest

from dpone_dagster.lifecycle import DponeError
from tests.helpers import pg
from tests.helpers.logical import OWN_SLOTS
from tests.replication.group import DDL_LOG, Group, tables_created

DOCS = """
CREATE SCHEMA app;
CREATE TABLE app.docs (id bigint PRIMARY KEY, title text, body text);
ALTER TABLE app.docs ALTER COLUMN body SET STORAGE EXTERNAL;
"""
BIG = "(SELECT string_agg(md5(random()::text || g::text), '') FROM generate_series(1, 400) g)"


def test_unchanged_toast_keeps_the_target_value_and_the_batch_newest(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    pg.execute(src, DOCS)
    pg.execute(src, f"INSERT INTO app.docs SELECT g, 't' || g, {BIG} FROM generate_series(1, 3) g")
    group = Group(src, target_dsn, ("app.docs",))
    group.run()
    # 1: only the title changes (the body is sent as unchanged TOAST); 2: a new body in the batch,
    # then a title update; 3: a key change that leaves the body alone, then a title update.
    pg.execute(src, "UPDATE app.docs SET title = 'x1' WHERE id = 1")
    pg.execute(src, f"UPDATE app.docs SET body = {BIG} WHERE id = 2")
    pg.execute(src, "UPDATE app.docs SET title = 'x2' WHERE id = 2")
    pg.execute(src, "UPDATE app.docs SET id = 30 WHERE id = 3")
    pg.execute(src, "UPDATE app.docs SET title = 'x3' WHERE id = 30")
    report = group.run()
    assert report.transactions == 5
    group.assert_equal()
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM app.docs WHERE length(body) = 12800") == 3


def test_key_change_delete_and_truncate(logical_source_dsn: str, target_dsn: str) -> None:
    src = logical_source_dsn
    pg.execute(src, "CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    pg.execute(src, "INSERT INTO public.t SELECT g, 'v' || g FROM generate_series(1, 100) g")
    group = Group(src, target_dsn, ("public.t",))
    group.run()
    pg.execute(src, "UPDATE public.t SET id = id + 1000 WHERE id <= 10")  # key changes
    pg.execute(src, "UPDATE public.t SET id = 5 WHERE id = 1005")  # back to a freed key
    pg.execute(src, "DELETE FROM public.t WHERE id BETWEEN 20 AND 29")
    pg.execute(src, "INSERT INTO public.t VALUES (20, 'again')")
    report = group.run()
    assert (report.tables[0].updated, report.tables[0].deleted) == (11, 10)
    group.assert_equal()
    # A TRUNCATE splits the batch: what came before it is gone, what came after stays.
    with psycopg.connect(src, autocommit=True) as conn:
        conn.execute("INSERT INTO public.t VALUES (500, 'before')")
        conn.execute("TRUNCATE public.t")
        conn.execute("INSERT INTO public.t VALUES (501, 'after')")
        conn.execute("UPDATE public.t SET v = 'after2' WHERE id = 501")
    report = group.run()
    assert report.tables[0].truncated == 1
    group.assert_equal()
    assert pg.fetch_all(target_dsn, "SELECT id, v FROM public.t") == [(501, "after2")]


def test_soft_deletes_mark_and_revive(logical_source_dsn: str, target_dsn: str) -> None:
    src = logical_source_dsn
    pg.execute(src, "CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    pg.execute(src, "INSERT INTO public.t SELECT g, 'v' || g FROM generate_series(1, 10) g")
    group = Group(src, target_dsn, ("public.t",))
    group.run(deletes="soft")
    pg.execute(src, "DELETE FROM public.t WHERE id <= 3")
    pg.execute(src, "INSERT INTO public.t VALUES (2, 'back')")
    group.run(deletes="soft")
    rows = pg.fetch_all(
        target_dsn, "SELECT id, v, _dpone_deleted_at IS NOT NULL FROM public.t ORDER BY id"
    )
    assert rows[:3] == [(1, "v1", True), (2, "back", False), (3, "v3", True)]
    assert all(not r[2] for r in rows[3:]) and len(rows) == 10
    live = pg.fetch_all(
        target_dsn, "SELECT id, v FROM public.t WHERE _dpone_deleted_at IS NULL ORDER BY id"
    )
    assert live == pg.fetch_all(src, "SELECT id, v FROM public.t ORDER BY id")


@pytest.mark.parametrize("deletes", ["hard", "soft"])
def test_a_target_one_merge_cannot_serve_takes_the_net_effect_step_by_step(
    logical_source_dsn: str, target_dsn: str, deletes: str
) -> None:
    """The net effect is one ``MERGE`` where the target allows it; a target with a rule does
    not (PostgreSQL refuses ``MERGE`` on it), and the same changes go by the netting table, the
    deletes by key and the merge sink's upsert (which a ``DELETE`` rule allows), to the same
    rows."""
    src = logical_source_dsn
    pg.execute(src, "CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    pg.execute(src, "INSERT INTO public.t SELECT g, 'v' || g FROM generate_series(1, 100) g")
    group = Group(src, target_dsn, ("public.t",))
    group.run(deletes=deletes)
    pg.execute(target_dsn, "CREATE RULE t_deleted AS ON DELETE TO public.t DO ALSO NOTIFY gone")
    pg.execute(target_dsn, DDL_LOG)
    pg.execute(src, "UPDATE public.t SET id = id + 1000 WHERE id <= 10")  # key changes
    pg.execute(src, "UPDATE public.t SET v = 'changed' WHERE id BETWEEN 40 AND 49")
    pg.execute(src, "DELETE FROM public.t WHERE id BETWEEN 20 AND 29")
    pg.execute(src, "INSERT INTO public.t VALUES (20, 'again'), (500, 'new')")
    report = group.run(deletes=deletes)
    assert (report.tables[0].updated, report.tables[0].deleted) == (20, 10)
    live = "" if deletes == "hard" else " WHERE _dpone_deleted_at IS NULL"
    target = pg.fetch_all(target_dsn, f"SELECT id, v FROM public.t{live} ORDER BY id")
    assert target == pg.fetch_all(src, "SELECT id, v FROM public.t ORDER BY id")
    assert tables_created(target_dsn) >= 2  # the staging and the netting table: step by step


HOSTILE = """
CREATE TYPE public.mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN public.posint AS integer CHECK (VALUE > 0);
CREATE TABLE public.h (
    id int PRIMARY KEY, tags text[], m public.mood, p public.posint, n numeric, f float8,
    r real, b bytea, j json, jb jsonb, ts timestamptz, iv interval, t text, ms int[][]
);
"""
HOSTILE_ROWS = r"""
INSERT INTO public.h VALUES
 (1, ARRAY['a,b', 'c"d', NULL, E'tab\there'], 'happy', 7, 1.000000000000000000001, 'NaN',
  '-Infinity', '\x00ff5c0a', '{"a": [1, 2.50]}', '{"b": null}', '2024-02-29 23:59:59.999999+05',
  '1 year 2 mons -3 days 04:05:06.7', E'line\nbreak\\ and \r cr', '{{1,2},{3,4}}'),
 (2, '{}', NULL, NULL, 'NaN', 'Infinity', 'NaN', '', 'null', '[]', 'infinity', '-178000000 years',
  '', NULL)
"""


def test_hostile_types_round_trip_exactly(logical_source_dsn: str, target_dsn: str) -> None:
    src = logical_source_dsn
    pg.execute(src, HOSTILE)
    pg.execute(src, HOSTILE_ROWS)
    group = Group(src, target_dsn, ("public.h",))
    group.run()
    pg.execute(src, "UPDATE public.h SET id = id + 10")
    pg.execute(src, HOSTILE_ROWS)
    pg.execute(src, "UPDATE public.h SET t = t || E'\\\\x' WHERE id = 1")
    report = group.run()
    assert report.tables[0].changes == 2 + 2 + 1
    group.assert_equal()


def test_a_table_without_key_is_refused_before_anything_is_created(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    pg.execute(src, "CREATE TABLE public.nokey (a int, b text)")
    group = Group(src, target_dsn, ("public.nokey",))
    with pytest.raises(DponeError) as err:
        group.run()
    assert err.value.code == "replica_identity_missing"
    assert pg.fetch_one(src, OWN_SLOTS) == 0
    assert pg.fetch_one(src, "SELECT count(*) FROM pg_publication") == 0


def test_an_identity_index_set_after_the_start_fails_the_run_naming_the_resync(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    pg.execute(src, "CREATE TABLE public.c (id int PRIMARY KEY, code text NOT NULL UNIQUE)")
    pg.execute(src, "INSERT INTO public.c SELECT g, 'c' || g FROM generate_series(1, 10) g")
    group = Group(src, target_dsn, ("public.c",))
    group.run()
    pg.execute(src, "ALTER TABLE public.c REPLICA IDENTITY USING INDEX c_code_key")
    pg.execute(src, "DELETE FROM public.c WHERE id <= 3")  # sent with the code, not the id
    with pytest.raises(DponeError) as err:
        group.run()
    assert err.value.code == "replica_identity_missing"
    assert any("resync=True" in action for action in err.value.next_actions)
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM public.c") == 10  # nothing applied
    pg.execute(src, "ALTER TABLE public.c REPLICA IDENTITY DEFAULT")
    group.run(resync=True)
    group.assert_equal()
