"""A staged batch's net effect by key (:meth:`~.apply.TableApply.apply`'s statements).

The last staged row of each key decides: a delete deletes (``soft``: sets the soft-delete
column to the deleting transaction's commit time, on live rows), an insert or update is
written. On a server with ``MERGE`` (PostgreSQL 15) all of it is one statement,
:func:`merge_net`: the staged rows sorted by key, newest first, kept once per key, each
looked up through the target's key index, then deleted, updated or inserted. Where that
statement cannot run (an older server, a target with rules, a key a concurrent writer
inserted), the net effect takes its steps: the netting table (:func:`net_table`), the deletes
(:func:`apply_deletes`), the upserts through the one ``merge`` sink (:func:`apply_upserts`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import psycopg
from psycopg import sql

from dpone_dagster.postgres.catalog import column_list, columns_equal
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.sinks import (
    MERGE_SINCE,
    aliased,
    apply_sink,
    key_lookups,
    set_from,
)
from dpone_dagster.postgres.soft_deletes import revive
from dpone_dagster.postgres.staging import staging_name_for
from dpone_dagster.postgres.target_plan import Sink, TablePlan

NetHook = Callable[[Connection, TablePlan, sql.Composable, Sequence[object]], None]
"""A hook on each net effect, before it is applied (:attr:`~.apply.TableApply.on_net`): called
with the session, the plan, a ``FROM`` item whose rows carry the net effect's keys (columns
named as the target's key) and that item's parameters."""


def temporary_name(target: TableName) -> TableName:
    """A staging name in ``pg_temp``: the staging and net tables live in the target
    transaction of one session, so they are temporary (no WAL, no file sync at creation)."""
    return TableName("pg_temp", staging_name_for(target).name)


_NET = sql.SQL(
    "SELECT DISTINCT ON ({k}) {c}, _dpone_op, _dpone_at FROM {s} ORDER BY {k}, _dpone_seq DESC"
)
"""The last staged row of each key."""


def merge_net(conn: Connection, plan: TablePlan, staging: TableName, soft: str | None) -> bool:
    """Applies the net effect of the staged rows in one ``MERGE`` (under a savepoint); False,
    with nothing applied, where it cannot run (see the module)."""
    if conn.info.server_version < MERGE_SINCE:
        return False
    names, keys = plan.column_names, plan.target_key
    others = [n for n in names if n not in keys]
    sets: list[sql.Composable] = [set_from("s", others)] if others else []
    deleted: sql.Composable = sql.SQL("WHEN MATCHED AND s._dpone_op = 'D' THEN DELETE")
    if soft is not None:  # marked, on a live row only; an upsert revives it
        deleted = sql.SQL(
            "WHEN MATCHED AND s._dpone_op = 'D' AND t.{m} IS NULL THEN UPDATE SET {m} ="
            " s._dpone_at WHEN MATCHED AND s._dpone_op = 'D' THEN DO NOTHING"
        ).format(m=sql.Identifier(soft))
        sets.append(sql.SQL("{} = NULL").format(sql.Identifier(soft)))
    updated: sql.Composable = sql.SQL("")
    if sets:
        updated = sql.SQL(" WHEN MATCHED THEN UPDATE SET {}").format(sql.SQL(", ").join(sets))
    net = _NET.format(k=column_list(keys), c=column_list(names), s=staging.ident)
    statement = sql.SQL(
        "MERGE INTO {t} AS t USING ({net}) AS s ON ({tk}) = ({sk}) {deleted}{updated}"
        " WHEN NOT MATCHED AND s._dpone_op <> 'D' THEN INSERT ({c})"
        " OVERRIDING SYSTEM VALUE VALUES ({sc})"
    ).format(
        t=plan.target.ident, net=net, tk=aliased("t", keys), sk=aliased("s", keys), deleted=deleted,
        updated=updated, c=column_list(names), sc=aliased("s", names),
    )  # fmt: skip
    try:
        with conn.transaction(), key_lookups(conn):
            conn.execute(statement)
    except _UNUSABLE:
        return False
    return True


_UNUSABLE = (
    psycopg.errors.UniqueViolation,  # a concurrent writer inserted a staged key
    psycopg.errors.FeatureNotSupported,  # a target with rules
)


def net_table(conn: Connection, plan: TablePlan, staging: TableName) -> tuple[TableName, int]:
    """The last staged row of each key, in a table of its own (one sort of the staging
    table); its rows."""
    keys = column_list(plan.target_key)
    net = temporary_name(plan.target)
    statement = sql.SQL("CREATE TEMPORARY TABLE {n} AS {net}").format(
        n=net.ident, net=_NET.format(k=keys, c=column_list(plan.column_names), s=staging.ident)
    )
    return net, conn.execute(statement).rowcount


def apply_deletes(conn: Connection, plan: TablePlan, net: TableName, soft: str | None) -> int:
    """Applies the keys whose last change is a delete, then leaves them out of ``net``; the
    rows left."""
    equal = columns_equal("t", "f", plan.target_key)
    target = plan.target.ident
    statement: sql.Composed
    if soft is None:
        statement = sql.SQL(
            "DELETE FROM {} AS t USING {} AS f WHERE f._dpone_op = 'D' AND {}"
        ).format(target, net.ident, equal)
    else:
        marked = sql.Identifier(soft)
        statement = sql.SQL(
            "UPDATE {} AS t SET {} = f._dpone_at FROM {} AS f"
            " WHERE f._dpone_op = 'D' AND {} AND t.{} IS NULL"
        ).format(target, marked, net.ident, equal, marked)
    with key_lookups(conn):  # the net table has no statistics
        conn.execute(statement)
    return conn.execute(sql.SQL("DELETE FROM {} WHERE _dpone_op = 'D'").format(net.ident)).rowcount


def apply_upserts(
    conn: Connection, plan: TablePlan, net: TableName, rows: int, soft: str | None
) -> None:
    """The last row of each key that is not a delete, through the one merge sink (which drops
    ``net``)."""
    if rows == 0:  # every key's last change was a delete
        conn.execute(sql.SQL("DROP TABLE {}").format(net.ident))
        return
    if soft is not None:
        revive(conn, plan.target, soft, plan.target_key, net)
    apply_sink(conn, plan, net, Sink.MERGE, rows, changes_only=True)
