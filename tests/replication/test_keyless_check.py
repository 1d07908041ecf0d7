"""The check of a replicated table without a primary key against real servers
(:mod:`dpone_dagster.replication.verify_keyless`): the whole table's digest on both sides, as of
the applied position. A target row changed, added or lost behind the replication's back fails
it, run after run, until the target agrees again; changes committed after the applied position
(still in the slot) are taken out of the source's digest, so writers never fail it; a table too
large for the sweep's budget is compared once every stated number of runs, and a run that
compared nothing says so."""

from __future__ import annotations

import math

from dpone_dagster.core.sweep import Sweep
from dpone_dagster.core.verification import Verification
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.replication.engine import Replication
from tests.helpers import pg
from tests.replication.group import Group

LOG = TableName("shop", "log")


def _log(src: str, rows: int = 200) -> Group:
    """``shop.log`` (no key, ``REPLICA IDENTITY FULL``) of ``rows`` rows, equal rows among
    them, and its group."""
    pg.execute(src, "CREATE SCHEMA shop; CREATE TABLE shop.log (at int, what text, big text)")
    pg.execute(src, "ALTER TABLE shop.log REPLICA IDENTITY FULL")
    pg.execute(
        src,
        "INSERT INTO shop.log SELECT g %% 50, 'w' || (g %% 7), NULL FROM generate_series(1, %s) g",
        (rows,),
    )
    pg.execute(src, "ANALYZE shop.log")
    return Group(src, "", ("shop.log",))


def _engine(group: Group, target: str, sweep: Sweep | None = None) -> Replication:
    checked = group.group(reconcile=True, sweep=sweep or Sweep())
    return Replication(checked, source=group.source, target=target)


def _run(group: Group, target: str, sweep: Sweep | None = None) -> Verification:
    return _engine(group, target, sweep).run().checks[LOG]


def test_a_target_row_changed_behind_the_replications_back_fails_until_it_agrees(
    logical_source_dsn: str, target_dsn: str
) -> None:
    group = Group(logical_source_dsn, target_dsn, _log(logical_source_dsn).tables)
    first = _run(group, target_dsn)
    assert (first.ok, first.scope, first.ranges_checked, first.rows_swept) == (
        True,
        "table",
        1,
        200,
    )
    # One of two equal rows changed on the target alone: the count agrees, the digest does not.
    pg.execute(
        target_dsn,
        "UPDATE shop.log SET what = 'tampered' WHERE ctid = (SELECT ctid FROM shop.log"
        " WHERE at = 1 AND what = 'w1' LIMIT 1)",
    )
    pg.execute(logical_source_dsn, "INSERT INTO shop.log VALUES (99, 'new', NULL)")
    failed = _run(group, target_dsn)
    assert not failed.ok and failed.unexplained == 1 and failed.ranges_checked == 1
    again = _run(group, target_dsn)  # nothing changed since: compared again, fails again
    assert not again.ok and again.ranges_checked == 1
    # A row lost on the target: the count differs too.
    pg.execute(target_dsn, "UPDATE shop.log SET what = 'w1' WHERE what = 'tampered'")
    pg.execute(target_dsn, "DELETE FROM shop.log WHERE ctid = (SELECT ctid FROM shop.log LIMIT 1)")
    lost = _run(group, target_dsn)
    assert not lost.ok and lost.unexplained == 1
    # Two rows added, twins of rows the source has: the target holds one row too many.
    pg.execute(target_dsn, "INSERT INTO shop.log SELECT * FROM shop.log WHERE at = 1 LIMIT 2")
    added = _run(group, target_dsn)
    assert not added.ok and added.unexplained == 1
    group.replication(resync=True).run()
    assert _run(group, target_dsn).ok
    group.assert_equal()


def test_changes_after_the_applied_position_are_taken_out_of_the_sources_digest(
    logical_source_dsn: str, target_dsn: str
) -> None:
    """The check run alone, with the source ahead of the target: inserts, an update of one of
    two equal rows, deletes and a TOASTed value left unchanged, all still in the slot."""
    src = logical_source_dsn
    group = Group(src, target_dsn, _log(src).tables)
    pg.execute(src, "INSERT INTO shop.log VALUES (7, 'toast', repeat('x', 300000))")
    assert _run(group, target_dsn).ok
    pg.execute(src, "INSERT INTO shop.log VALUES (1, 'w1', NULL), (500, 'later', NULL)")
    pg.execute(
        src,
        "UPDATE shop.log SET at = 501 WHERE ctid = (SELECT ctid FROM shop.log WHERE at = 1"
        " AND what = 'w1' LIMIT 1)",
    )
    pg.execute(src, "UPDATE shop.log SET at = 8 WHERE what = 'toast'")  # big left unchanged
    pg.execute(src, "DELETE FROM shop.log WHERE at = 2")
    [check] = _engine(group, target_dsn).check().values()
    assert (check.ok, check.scope, check.ranges_checked) == (True, "table", 1)
    # The same target, changed behind the replication's back, fails the same check.
    pg.execute(target_dsn, "DELETE FROM shop.log WHERE ctid = (SELECT ctid FROM shop.log LIMIT 1)")
    [check] = _engine(group, target_dsn).check().values()
    assert not check.ok
    # A TRUNCATE after the applied position: nothing can be told, nothing is claimed.
    pg.execute(src, "TRUNCATE shop.log")
    [check] = _engine(group, target_dsn).check().values()
    assert check.ranges_checked == 0 and check.changed_since_mark == 1


def test_a_table_over_the_budget_is_compared_every_stated_number_of_runs(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    group = Group(src, target_dsn, _log(src, rows=1000).tables)
    sweep = Sweep(rows=300)  # 1,000 rows: the whole table once every four runs
    every = math.ceil(1000 / 300)
    seen = [_run(group, target_dsn, sweep) for _ in range(2 * every + 1)]
    compared = [i for i, check in enumerate(seen) if check.ranges_checked == 1]
    assert compared == [0, every, 2 * every], [c.ranges_checked for c in seen]
    assert all(c.ranges_total == every and c.ok for c in seen)
    idle = seen[1]
    assert idle.rows_swept == 0 and idle.swept_at == seen[0].proved_at
