"""A staged batch's net effect by key (:meth:`~.apply.TableApply.apply`'s statements).

The last staged row of each key decides: a delete deletes (``soft``: sets the soft-delete
column to the deleting transaction's commit time, on live rows), an insert or update goes
through the one ``merge`` sink (:func:`~dpone_dagster.postgres.sinks.apply_sink`).
"""

from __future__ import annotations

from psycopg import sql

from dpone_dagster.postgres.catalog import column_list, columns_equal
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.plan import Sink, TablePlan
from dpone_dagster.postgres.sinks import apply_sink, key_lookups
from dpone_dagster.postgres.soft_deletes import revive
from dpone_dagster.postgres.staging import staging_name_for


def temporary_name(target: TableName) -> TableName:
    """A staging name in ``pg_temp``: the staging and net tables live in the target
    transaction of one session, so they are temporary (no WAL, no file sync at creation)."""
    return TableName("pg_temp", staging_name_for(target).name)


def net_table(conn: Connection, plan: TablePlan, staging: TableName) -> tuple[TableName, int]:
    """The last staged row of each key, in a table of its own (one sort of the staging
    table); its rows."""
    keys = column_list(plan.target_key)
    net = temporary_name(plan.target)
    statement = sql.SQL(
        "CREATE TEMPORARY TABLE {n} AS SELECT DISTINCT ON ({k}) {c}, _dpone_op, _dpone_at"
        " FROM {s} ORDER BY {k}, _dpone_seq DESC"
    ).format(n=net.ident, k=keys, c=column_list(plan.column_names), s=staging.ident)
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
