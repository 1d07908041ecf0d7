"""The three sinks: how a loaded staging table is applied to its target.

A sink applies a loaded staging table to the target inside the target's transaction:

- ``replace`` leaves the target with exactly the staged rows. When the target is a plain table
  that nothing else depends on (or does not exist yet), the staging table was created with the
  target's full definition and no index; the sink builds the primary key on it, drops the old
  table and renames the staging table into its place (as pgcopydb does). Otherwise it deletes
  the old rows and inserts the new ones. Either way it happens in one transaction: readers see
  the old table until the commit, then the new one, never an empty or half-filled table.
- ``append`` inserts the staged rows.
- ``merge`` inserts new keys and updates rows whose values changed, by primary key.

"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import psycopg
from psycopg import sql

from .catalog import column_list, relation_oid
from .identifiers import MAX_IDENTIFIER_BYTES, TableName
from .plan import Sink, TablePlan


@dataclass(frozen=True)
class SinkResult:
    """What a sink did to one target table.

    Attributes:
        method: ``create`` (a new target from staging), ``swap`` (the old target replaced by
            the staging table), ``rewrite`` (old rows deleted, new rows inserted), ``append``
            or ``merge``.
        rows_inserted: Rows the target gained (for ``create``/``swap``: its new row count).
        rows_updated: Rows a merge updated because a value changed.
    """

    method: Literal["create", "swap", "rewrite", "append", "merge"]
    rows_inserted: int
    rows_updated: int = 0


def apply_sink(
    conn: psycopg.Connection[tuple[object, ...]],
    plan: TablePlan,
    staging: TableName,
    sink: Sink,
    staged_rows: int,
    *,
    new_keys_expected: bool = False,
) -> SinkResult:
    """Applies a loaded staging table to the target, in ``conn``'s current transaction.

    The staging table is gone afterwards (renamed into place or dropped).

    Args:
        conn: The target session, inside the load's transaction.
        plan: The table's plan.
        staging: The loaded staging table.
        sink: ``replace``, ``append`` or ``merge``.
        staged_rows: Rows in the staging table.
        new_keys_expected: For ``merge``: the staged keys are probably all new to the target
            (an initial load), so a plain ``INSERT`` is tried first, under a savepoint; the
            first key already there undoes it and the merge runs as usual.

    Returns:
        What the sink did, with the rows the target gained or changed.
    """
    if plan.swap:
        return _swap(conn, plan, staging, staged_rows)
    names = column_list(plan.columns)
    insert = sql.SQL("INSERT INTO {} AS t ({}) OVERRIDING SYSTEM VALUE SELECT {} FROM {}").format(
        plan.target.ident, names, names, staging.ident
    )
    if sink == "merge":
        result = _merge(conn, plan, insert, new_keys_expected)
    else:
        if sink == "replace":
            conn.execute(sql.SQL("DELETE FROM {}").format(plan.target.ident))
        rows = conn.execute(insert).rowcount
        result = SinkResult("rewrite" if sink == "replace" else "append", rows)
    conn.execute(sql.SQL("DROP TABLE {}").format(staging.ident))
    return result


def _swap(
    conn: psycopg.Connection[tuple[object, ...]], plan: TablePlan, staging: TableName, rows: int
) -> SinkResult:
    temporary_pk = f"{staging.name}_pkey"
    if plan.target_key:
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} PRIMARY KEY ({})").format(
                staging.ident, sql.Identifier(temporary_pk), column_list(plan.target_key)
            )
        )
    if plan.target_exists:
        # From here to the commit the target is locked: readers wait, then see the new table.
        conn.execute(sql.SQL("DROP TABLE {}").format(plan.target.ident))
    conn.execute(
        sql.SQL("ALTER TABLE {} RENAME TO {}").format(
            staging.ident, sql.Identifier(plan.target.name)
        )
    )
    if plan.target_key:
        final = plan.target_pk_name or default_pk_name(plan.target.name)
        if relation_oid(conn, TableName(plan.target.schema, final)) is None:
            conn.execute(
                sql.SQL("ALTER TABLE {} RENAME CONSTRAINT {} TO {}").format(
                    plan.target.ident, sql.Identifier(temporary_pk), sql.Identifier(final)
                )
            )
    return SinkResult("swap" if plan.target_exists else "create", rows)


def _merge(
    conn: psycopg.Connection[tuple[object, ...]],
    plan: TablePlan,
    insert: sql.Composed,
    new_keys_expected: bool,
) -> SinkResult:
    if new_keys_expected and plan.target_key:
        # A plain INSERT costs less than half of INSERT ... ON CONFLICT (no speculative
        # insertion, no RETURNING); a savepoint keeps the load's transaction if a key exists.
        try:
            with conn.transaction():
                return SinkResult("merge", conn.execute(insert).rowcount)
        except psycopg.errors.UniqueViolation:
            pass
    others = [c.name for c in plan.columns if c.name not in plan.target_key]
    action: sql.Composable
    if others:
        # Compared as text: exact for every type, including json and types without equality.
        action = sql.SQL(
            "DO UPDATE SET {} WHERE ROW({})::text IS DISTINCT FROM ROW({})::text"
        ).format(
            sql.SQL(", ").join(
                sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(n), sql.Identifier(n))
                for n in others
            ),
            sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(n)) for n in others),
            sql.SQL(", ").join(sql.SQL("EXCLUDED.{}").format(sql.Identifier(n)) for n in others),
        )
    else:
        action = sql.SQL("DO NOTHING")
    statement = sql.SQL(
        "WITH merged AS ({} ON CONFLICT ({}) {} RETURNING t.xmax = 0 AS inserted) "
        "SELECT count(*) FILTER (WHERE inserted), count(*) FILTER (WHERE NOT inserted) "
        "FROM merged"
    ).format(insert, column_list(plan.target_key), action)
    row = conn.execute(statement).fetchone()
    assert row is not None
    return SinkResult("merge", int(row[0]), int(row[1]))  # type: ignore[call-overload]


def default_pk_name(table: str) -> str:
    """``<table>_pkey``, with the table part cut to fit 63 bytes as PostgreSQL would."""
    room = MAX_IDENTIFIER_BYTES - len("_pkey")
    head = table.encode()[:room].decode(errors="ignore")
    return f"{head}_pkey"
