"""Unchanged TOASTed values of a staged batch, given their values before the net effect.

``pgoutput`` does not send a TOASTed value an update left unchanged (``u``, under ``REPLICA
IDENTITY DEFAULT``): the staged row holds NULL there and a flag (``_dpone_u``, one ``0``/``1``
per column). Before the net effect is applied (:meth:`~.apply.TableApply.apply`), each flagged
value takes the newest value of its column before it in the batch, along the row's history
(through a key change, to the old key, ``_dpone_ok<i>``), else the target's row's value. A
value neither holds fails the run (``replication_toast_unresolved``): the target was changed
outside the replication. Never NULL, never a placeholder.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from dpone_dagster.core.errors import engine_error
from dpone_dagster.postgres.catalog import column_list
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.target_plan import TablePlan


def _lineage(keys: Sequence[str], alias: str, *, old_keys: bool) -> list[sql.Composable]:
    """The key a staged row's history continues from: its old key after a key change (when
    the batch staged any, ``old_keys``)."""
    out: list[sql.Composable] = []
    for i, name in enumerate(keys):
        if old_keys:
            out.append(sql.SQL("coalesce({a}.{o}, {a}.{k})").format(
                a=sql.Identifier(alias), o=sql.Identifier(f"_dpone_ok{i}"), k=sql.Identifier(name)
            ))  # fmt: skip
        else:
            out.append(sql.SQL("{}.{}").format(sql.Identifier(alias), sql.Identifier(name)))
    return out


def index_history(conn: Connection, staging: TableName, keys: Sequence[str]) -> None:
    """Indexes the staging table by key and order: each row's previous row is one lookup
    (once per staging table; its later rows are indexed too)."""
    conn.execute(
        sql.SQL("CREATE INDEX ON {} ({}, _dpone_seq)").format(staging.ident, column_list(keys))
    )


def resolve_unchanged(
    conn: Connection,
    plan: TablePlan,
    staged: TableName,
    columns: Sequence[int],
    *,
    old_keys: bool,
) -> None:
    """Gives each staged unchanged TOASTed value of ``columns`` (positions in the plan's
    columns) its value, in the staging table ``staged`` (indexed by :func:`index_history`).

    Per column, in passes: a value whose row has no earlier non-delete row along its history
    takes the target's; one whose previous row along its history knows the value takes it.
    Each pass resolves at least the earliest row of every chain, so the passes end.

    Raises:
        EngineError: ``replication_toast_unresolved`` for a value neither holds.
    """
    keys = plan.target_key
    staging = staged.ident
    here = _lineage(keys, "r", old_keys=old_keys)
    of_p = [sql.SQL("p.{}").format(sql.Identifier(k)) for k in keys]
    lineage_match = sql.SQL(" AND ").join(
        sql.SQL("{} = {}").format(a, b) for a, b in zip(of_p, here, strict=True)
    )
    target_match = sql.SQL(" AND ").join(
        sql.SQL("t.{} = {}").format(sql.Identifier(k), b) for k, b in zip(keys, here, strict=True)
    )
    previous = sql.SQL(
        "(SELECT p._dpone_seq FROM {s} AS p WHERE {m} AND p._dpone_seq < r._dpone_seq"
        " AND p._dpone_op <> 'D' ORDER BY p._dpone_seq DESC LIMIT 1)"
    ).format(s=staging, m=lineage_match)
    for index in columns:
        column = sql.Identifier(plan.column_names[index])
        position = sql.Literal(index + 1)
        flagged = sql.SQL("substr(r._dpone_u, {}, 1) = '1'").format(position)
        cleared = sql.SQL("overlay(r._dpone_u PLACING '0' FROM {} FOR 1)").format(position)
        from_target = sql.SQL(
            "UPDATE {s} AS r SET {c} = t.{c}, _dpone_u = {clr} FROM {t} AS t"
            " WHERE {f} AND {tm} AND {prev} IS NULL"
        ).format(s=staging, c=column, clr=cleared, t=plan.target.ident, f=flagged,
                 tm=target_match, prev=previous)  # fmt: skip
        conn.execute(from_target)
        from_previous = sql.SQL(
            "UPDATE {s} AS r SET {c} = p.{c}, _dpone_u = {clr} FROM {s} AS p"
            " WHERE {f} AND p._dpone_seq = {prev}"
            " AND substr(p._dpone_u, {pos}, 1) IS DISTINCT FROM '1'"
        ).format(s=staging, c=column, clr=cleared, f=flagged, prev=previous, pos=position)
        while conn.execute(from_previous).rowcount:
            pass
        left = conn.execute(
            sql.SQL("SELECT count(*) FROM {} AS r WHERE {}").format(staging, flagged)
        ).fetchone()
        if left is not None and int(left[0]):
            raise engine_error(
                "replication_toast_unresolved",
                f"{int(left[0])} unchanged value(s) of column {plan.column_names[index]!r} of "
                f"{plan.target} have no row in the target to take them from.",
            )
