"""A run that applies a few deletes costs what it changes: its keys are deleted by key in one
statement, with no staging table (``replication/held.py``), and the
batch goes the staged way, in its order, as soon as anything else arrives in it.

The target's event trigger logs every ``CREATE TABLE`` (temporary ones included) a run makes, so
"no staging" is seen on the server, not inferred from timings."""

from __future__ import annotations

import psycopg

from dpone_dagster.replication.engine import Replication
from dpone_dagster.replication.held import HELD_DELETES
from tests.helpers import pg
from tests.replication.group import DDL_LOG, Group, tables_created

# A composite key whose text needs care: tabs, backslashes, quotes, a newline, non-ASCII, and
# a numeric whose text is not its shortest form.
KEYED = """
CREATE TABLE public.k (name text, amount numeric, v text, PRIMARY KEY (name, amount));
INSERT INTO public.k
SELECT CASE mod(g, 4) WHEN 0 THEN E'tab\\there' WHEN 1 THEN E'back\\\\slash' WHEN 2 THEN 'quo"te'
                  ELSE E'nl\\nü' END || g,
       g + 0.50, 'v' || g
FROM generate_series(1, 400) g;
"""


def checked(group: Group) -> Replication:
    """The group's engine with its check."""
    return Replication(group.group(reconcile=True), source=group.source, target=group.target)


def keyed_group(source: str, target: str) -> Group:
    pg.execute(source, KEYED)
    group = Group(source, target, ("public.k",))
    group.run()
    pg.execute(target, DDL_LOG)
    return group


def test_a_deletes_only_batch_is_applied_by_key_without_a_staging_table(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    group = keyed_group(src, target_dsn)
    pg.execute(src, "DELETE FROM public.k WHERE mod(amount::int, 3) = 0")  # one transaction
    pg.execute(src, "DELETE FROM public.k WHERE left(name, 2) = 'nl' AND amount < 40")  # another
    report = group.run()
    assert report.tables[0].deleted == 133 + 7
    group.assert_equal()
    assert tables_created(target_dsn) == 0
    # The same run with an update staged: the log sees its staging table (the count above can
    # fail; the net effect is one MERGE over it).
    pg.execute(src, "UPDATE public.k SET v = 'changed' WHERE amount < 10")
    pg.execute(src, "DELETE FROM public.k WHERE amount BETWEEN 10 AND 12")
    group.run()
    group.assert_equal()
    assert tables_created(target_dsn) >= 1


def test_held_deletes_keep_their_order_when_an_insert_joins_the_batch(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    pg.execute(src, "CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    pg.execute(src, "INSERT INTO public.t SELECT g, 'v' || g FROM generate_series(1, 50) g")
    group = Group(src, target_dsn, ("public.t",))
    group.run()
    with psycopg.connect(src, autocommit=True) as conn:
        conn.execute("DELETE FROM public.t WHERE id <= 10")  # held
        conn.execute("INSERT INTO public.t VALUES (5, 'back')")  # stages the held deletes first
        conn.execute("DELETE FROM public.t WHERE id = 20")
        conn.execute("UPDATE public.t SET id = 7 WHERE id = 30")  # into a key deleted above
    report = group.run()
    assert (report.tables[0].inserted, report.tables[0].deleted) == (1, 11)
    group.assert_equal()
    assert pg.fetch_all(
        target_dsn, "SELECT id, v FROM public.t WHERE id IN (5, 7) ORDER BY id"
    ) == [
        (5, "back"),
        (7, "v30"),
    ]


def test_more_deletes_than_are_held_go_the_staged_way(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    rows = HELD_DELETES + 2_000
    pg.execute(src, "CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    pg.execute(
        src, "INSERT INTO public.t SELECT g, 'v' || g FROM generate_series(1, %s) g", (rows,)
    )
    group = Group(src, target_dsn, ("public.t",))
    group.run()
    pg.execute(target_dsn, DDL_LOG)
    pg.execute(src, "DELETE FROM public.t WHERE id > 1000")
    report = group.run()
    assert report.tables[0].deleted == rows - 1000
    group.assert_equal()
    assert tables_created(target_dsn) >= 1  # the staging table


def test_held_soft_deletes_mark_the_rows_with_their_commit_time(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    pg.execute(src, "CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    pg.execute(src, "INSERT INTO public.t SELECT g, 'v' || g FROM generate_series(1, 20) g")
    group = Group(src, target_dsn, ("public.t",))
    group.run(deletes="soft")
    pg.execute(target_dsn, DDL_LOG)
    with psycopg.connect(src) as conn:
        conn.execute("DELETE FROM public.t WHERE id <= 4")
        [[committed]] = conn.execute("SELECT now()").fetchall()  # the transaction's start
        conn.commit()
    group.run(deletes="soft")
    assert tables_created(target_dsn) == 0
    marked = pg.fetch_all(
        target_dsn, "SELECT id, _dpone_deleted_at FROM public.t WHERE _dpone_deleted_at IS NOT NULL"
    )
    assert sorted(r[0] for r in marked) == [1, 2, 3, 4]
    assert all(at >= committed for _, at in marked)  # the commit time, after the start
    live = pg.fetch_all(
        target_dsn, "SELECT id, v FROM public.t WHERE _dpone_deleted_at IS NULL ORDER BY id"
    )
    assert live == pg.fetch_all(src, "SELECT id, v FROM public.t ORDER BY id")
    # A second run's deletes leave the first run's marks as they were.
    pg.execute(src, "DELETE FROM public.t WHERE id IN (4, 5)")
    group.run(deletes="soft")
    again = dict(pg.fetch_all(target_dsn, "SELECT id, _dpone_deleted_at FROM public.t"))
    assert again[4] == dict(marked)[4] and again[5] is not None


def test_the_check_knows_the_keys_a_deletes_only_run_applied(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    group = keyed_group(src, target_dsn)
    checked(group).run()
    pg.execute(src, "DELETE FROM public.k WHERE amount < 21")
    report = checked(group).run()
    assert tables_created(target_dsn) == 0
    [check] = report.checks.values()
    # Every deleted key is verified gone from the target: the held keys reached the check.
    assert check.ok and check.scope == "run" and check.keys_checked == 20, check
    assert check.unexplained == 0
