"""The target side: staging tables, the three sinks, and the commit whose answer decides it all.

A sink applies a loaded staging table to the target inside the target's transaction:

- ``replace`` leaves the target with exactly the staged rows. When the target is a plain table
  that nothing else depends on (or does not exist yet), the staging table was created with the
  target's full definition and no index; the sink builds the primary key on it, drops the old
  table and renames the staging table into its place (as pgcopydb does). Otherwise it deletes
  the old rows and inserts the new ones. Either way it happens in one transaction: readers see
  the old table until the commit, then the new one, never an empty or half-filled table.
- ``append`` inserts the staged rows.
- ``merge`` inserts new keys and updates rows whose values changed, by primary key.

:func:`commit_target` turns the server's answer to COMMIT into the terminal outcome's evidence:
an answer means committed (or refused: an error with a live session); a lost answer means the
outcome is unknown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import psycopg
from psycopg import sql

from dpone_dagster.lifecycle import DponeError, redact

from .catalog import Column, column_list, relation_oid
from .identifiers import MAX_IDENTIFIER_BYTES, TableName
from .plan import Sink, TablePlan
from .staging import PostgresStagingTable, staging_name_for

# Everything a swapped-in table must keep from the old one, except indexes (built after the
# load, which is faster) and identity (a swap never replaces a table that has one).
_LIKE_TARGET = sql.SQL(
    "LIKE {} INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING CONSTRAINTS INCLUDING STORAGE "
    "INCLUDING COMPRESSION INCLUDING COMMENTS"
)


class TargetCommitUnknownError(DponeError):
    """COMMIT was sent to the target but its acknowledgement never arrived."""


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


def column_type(column: Column) -> sql.Composable:
    """A column's type for DDL: built-in types as the catalog prints them, user-defined types
    (enums, domains, their arrays) composed from their exact schema and name."""
    if not column.user_type:
        return sql.SQL(column.type_sql)  # format_type() output for a built-in type
    suffix = sql.SQL("[]" if column.type_sql.endswith("[]") else "")
    return sql.Composed([sql.Identifier(column.type_schema, column.type_name), suffix])


def table_definition(columns: Sequence[Column], *, constraints: bool = True) -> sql.Composed:
    """Column definitions: name and type, plus (with ``constraints``) generation expression,
    constant default and NOT NULL, as the catalog describes them."""
    definitions = []
    for column in columns:
        parts: list[sql.Composable] = [column.ident, column_type(column)]
        if constraints and column.generation_sql is not None:
            parts.append(
                sql.SQL("GENERATED ALWAYS AS ({}) STORED").format(sql.SQL(column.generation_sql))
            )
        elif constraints and column.default_sql is not None:
            parts.append(sql.SQL("DEFAULT {}").format(sql.SQL(column.default_sql)))
        if constraints and column.not_null:
            parts.append(sql.SQL("NOT NULL"))
        definitions.append(sql.SQL(" ").join(parts))
    return sql.SQL(", ").join(definitions)


def staging_table(
    conn: psycopg.Connection[tuple[object, ...]], plan: TablePlan, *, dsn: str
) -> PostgresStagingTable:
    """The staging table for ``plan``, in the target's schema, not yet created.

    A staging table that will become the target carries the target's full definition (the
    source's, for a target created by this copy) and is as durable as the target; one whose
    rows are inserted into the target holds just the copied columns and is ``UNLOGGED``.
    """
    name = staging_name_for(plan.target)
    if not plan.target_exists:
        return PostgresStagingTable(
            conn, name, columns=table_definition(plan.source_columns), unlogged=False, dsn=dsn
        )
    if plan.swap:
        return PostgresStagingTable(
            conn,
            name,
            columns=_LIKE_TARGET.format(plan.target.ident),
            unlogged=plan.unlogged_target,
            dsn=dsn,
        )
    return PostgresStagingTable(
        conn, name, columns=table_definition(plan.written, constraints=False), dsn=dsn
    )


def ensure_schema(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> None:
    """Creates ``schema`` if it does not exist (a target created in a new schema)."""
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))


def apply_sink(
    conn: psycopg.Connection[tuple[object, ...]],
    plan: TablePlan,
    staging: TableName,
    sink: Sink,
    staged_rows: int,
) -> SinkResult:
    """Applies a loaded staging table to the target, in ``conn``'s current transaction.

    The staging table is gone afterwards (renamed into place or dropped).

    Args:
        conn: The target session, inside the load's transaction.
        plan: The table's plan.
        staging: The loaded staging table.
        sink: ``replace``, ``append`` or ``merge``.
        staged_rows: Rows in the staging table.

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
        result = _merge(conn, plan, insert)
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
    conn: psycopg.Connection[tuple[object, ...]], plan: TablePlan, insert: sql.Composed
) -> SinkResult:
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


def commit_target(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """Commits the target transaction; the answer decides the terminal outcome.

    Raises:
        TargetCommitUnknownError: ``target_commit_unknown`` when the session was lost while COMMIT
            was in flight: the target may or may not hold the rows.
        psycopg.Error: the server answered with an error (it did not commit).
    """
    try:
        conn.commit()
    except psycopg.Error as exc:
        if conn.broken or conn.closed:
            raise TargetCommitUnknownError(
                "target_commit_unknown",
                "COMMIT was sent to the target but its acknowledgement was lost "
                f"({redact(str(exc)).strip()}): the target may or may not hold the rows.",
                [
                    "Check the target table before rerunning; a rerun with replace or merge "
                    "is safe, an append could add the rows twice.",
                    "Retained files (whole COPY) are the evidence of what was sent.",
                ],
            ) from exc
        raise
