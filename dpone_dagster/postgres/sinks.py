"""The three sinks: how a loaded staging table is applied to its target.

A sink applies a loaded staging table to the target inside the target's transaction:

- ``replace`` leaves the target with exactly the staged rows. When the target is a plain table
  that nothing else depends on (or does not exist yet), the staging table was created with the
  target's full definition and no index; the sink builds the primary key on it, drops the old
  table and renames the staging table into its place (as pgcopydb does). Otherwise it deletes
  the old rows and inserts the new ones. Either way it happens in one transaction: readers see
  the old table until the commit, then the new one, never an empty or half-filled table. The
  swap's ``DROP`` and ``RENAME`` take their lock in short attempts (:mod:`.lock_wait`).
- ``append`` inserts the staged rows.
- ``merge`` inserts new keys and updates rows whose values changed, by primary key: one
  ``MERGE`` on PostgreSQL 15 and later, ``INSERT ... ON CONFLICT DO UPDATE`` where ``MERGE``
  cannot be used or cannot be counted (see :func:`_merge_statement`). With ``changes_only``
  (every staged row is a change the target takes: a replication's net effect) it writes each
  staged row without comparing it to the target's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import psycopg
from psycopg import sql

from .catalog import column_list, relation_oid
from .connection import Connection
from .identifiers import MAX_IDENTIFIER_BYTES, TableName
from .lock_wait import under_lock_wait
from .target_plan import Sink, TablePlan


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
    conn: Connection,
    plan: TablePlan,
    staging: TableName,
    sink: Sink,
    staged_rows: int,
    *,
    new_keys_expected: bool = False,
    changes_only: bool = False,
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
        changes_only: For ``merge``: every staged row is a change (a netted batch of a
            replication): a matched row is updated without comparing it to the target's, and
            ``rows_updated`` counts every matched row.

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
        how = _Merging(new_keys_expected, changes_only)
        result = _merge(conn, plan, staging, insert, how)
    else:
        if sink == "replace":
            conn.execute(sql.SQL("DELETE FROM {}").format(plan.target.ident))
        rows = conn.execute(insert).rowcount
        result = SinkResult("rewrite" if sink == "replace" else "append", rows)
    conn.execute(sql.SQL("DROP TABLE {}").format(staging.ident))
    return result


def _swap(conn: Connection, plan: TablePlan, staging: TableName, rows: int) -> SinkResult:
    temporary_pk = f"{staging.name}_pkey"
    if plan.target_key:
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} PRIMARY KEY ({})").format(
                staging.ident, sql.Identifier(temporary_pk), column_list(plan.target_key)
            )
        )
    if plan.target_exists:
        # In short attempts (readers never queue behind it for long); once granted, the target
        # is locked to the commit: readers wait, then see the new table.
        under_lock_wait(
            conn, [plan.target], lambda: _swap_in(conn, plan, staging, temporary_pk),
            doing="swap in the new rows",
        )  # fmt: skip
        return SinkResult("swap", rows)
    _swap_in(conn, plan, staging, temporary_pk)
    return SinkResult("create", rows)


def _swap_in(conn: Connection, plan: TablePlan, staging: TableName, temporary_pk: str) -> None:
    """Drops the old target (if any) and renames the staging table and its key into place."""
    if plan.target_exists:
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


@dataclass(frozen=True)
class _Merging:
    """How a merge runs: what the caller knows of the staged rows."""

    new_keys_expected: bool
    changes_only: bool


def _merge(
    conn: Connection,
    plan: TablePlan,
    staging: TableName,
    insert: sql.Composed,
    how: _Merging,
) -> SinkResult:
    if how.new_keys_expected and plan.target_key:
        # A plain INSERT costs less than half of INSERT ... ON CONFLICT (no speculative
        # insertion, no RETURNING); a savepoint keeps the load's transaction if a key exists.
        try:
            with conn.transaction():
                return SinkResult("merge", conn.execute(insert).rowcount)
        except psycopg.errors.UniqueViolation:
            pass
    if conn.info.server_version >= MERGE_SINCE:
        merged = _merge_statement(conn, plan, staging, how)
        if merged is not None:
            return merged
    return _upsert(conn, plan, insert, how.changes_only)


MERGE_SINCE = 150000
"""The first server version with ``MERGE`` (PostgreSQL 15)."""

# A typed difference in a column of one of these types implies a difference of its text, so it
# may decide "changed" before the row's text is built: the text comparison alone decides
# "unchanged" (numeric 1.0 and 1.00 are equal as numbers, not as text).
_TYPED_FIRST = frozenset(
    {"int2", "int4", "int8", "bool", "date", "timestamp", "timestamptz", "uuid", "numeric"}
)


def aliased(alias: str, names: Sequence[str]) -> sql.Composed:
    """``alias."a", alias."b"`` for SQL text."""
    return sql.SQL(", ").join(
        sql.SQL("{}.{}").format(sql.Identifier(alias), sql.Identifier(n)) for n in names
    )


def set_from(alias: str, names: Sequence[str]) -> sql.Composed:
    """``"a" = alias."a", ...``: an ``UPDATE``'s assignments from the row ``alias``."""
    return sql.SQL(", ").join(
        sql.SQL("{} = {}.{}").format(sql.Identifier(n), sql.Identifier(alias), sql.Identifier(n))
        for n in names
    )


def _changed(plan: TablePlan, others: Sequence[str], old: str, new: str) -> sql.Composable:
    """The predicate "the staged row ``new`` differs from the target row ``old``".

    Compared as text: exact for every type, including json and types without equality. Columns
    of the types in :data:`_TYPED_FIRST` are compared first by value, which is cheaper and
    settles most changed rows (an incremental stream's cursor) without building any text.
    """
    types = {c.name: c for c in plan.written}
    typed = [
        n for n in others
        if types[n].type_schema == "pg_catalog" and types[n].type_name in _TYPED_FIRST
        and not types[n].type_sql.endswith("[]")
    ]  # fmt: skip
    text = sql.SQL("ROW({})::text IS DISTINCT FROM ROW({})::text").format(
        aliased(old, others), aliased(new, others)
    )
    first = [
        sql.SQL("{}.{} IS DISTINCT FROM {}.{}").format(
            sql.Identifier(old), sql.Identifier(n), sql.Identifier(new), sql.Identifier(n)
        )
        for n in typed
    ]
    return sql.SQL("({})").format(sql.SQL(" OR ").join([*first, text]))


class _CountsDisagreeError(Exception):
    """The table's transaction counters do not add up to MERGE's own row count."""


_MERGE_UNUSABLE = (
    psycopg.errors.UniqueViolation,  # a concurrent writer inserted a staged key
    psycopg.errors.FeatureNotSupported,  # a target with rules (ON CONFLICT takes DELETE rules)
    _CountsDisagreeError,
)


# This transaction's own insert and update counters of the target (summed over its partitions):
# their change across the MERGE splits its row count into inserted and updated rows (PostgreSQL
# 15 and 16 have no RETURNING for MERGE).
_XACT_COUNTS = """
WITH target AS (SELECT %s::regclass AS relid),
     tables AS (SELECT relid FROM target
                UNION ALL SELECT p.relid FROM target, pg_partition_tree(target.relid) AS p
                WHERE p.isleaf)
SELECT sum(pg_stat_get_xact_tuples_inserted(relid))::bigint,
       sum(pg_stat_get_xact_tuples_updated(relid))::bigint
FROM tables
"""
_JOIN_METHODS = (
    "SELECT current_setting('enable_hashjoin'), current_setting('enable_mergejoin'),"
    " set_config('enable_hashjoin', %s, true), set_config('enable_mergejoin', %s, true)"
)
"""Sets the two join methods for the transaction; their settings before, first."""


def _merge_statement(
    conn: Connection, plan: TablePlan, staging: TableName, how: _Merging
) -> SinkResult | None:
    """``MERGE`` of the staged rows by key, under a savepoint; ``None`` when it cannot be used
    here (the savepoint undid it): a key a concurrent writer inserted meanwhile, a target with
    rules, or counters that do not add up (a trigger writing the target, ``track_counts`` off).

    Each staged row is looked up through the target's key index, as ``ON CONFLICT`` does, but
    without its speculative insertion and row locks (measured for a replication's batches of
    200,000 rows into 1M: a hash join is no faster).
    """
    others = [c.name for c in plan.columns if c.name not in plan.target_key]
    names = column_list(plan.columns)
    keys = plan.target_key
    matched: sql.Composable = sql.SQL("")
    if others:
        when = (
            sql.SQL("")
            if how.changes_only
            else sql.SQL("AND {} ").format(_changed(plan, others, "t", "s"))
        )
        matched = sql.SQL("WHEN MATCHED {}THEN UPDATE SET {} ").format(when, set_from("s", others))
    statement = sql.SQL(
        "MERGE INTO {} AS t USING {} AS s ON ({}) = ({}) {}"
        "WHEN NOT MATCHED THEN INSERT ({}) OVERRIDING SYSTEM VALUE VALUES ({})"
    ).format(
        plan.target.ident, staging.ident, aliased("t", keys), aliased("s", keys), matched, names,
        aliased("s", plan.column_names),
    )  # fmt: skip
    try:
        with conn.transaction():
            return _counted_merge(conn, plan.target, statement)
    except _MERGE_UNUSABLE:
        return None


@contextmanager
def key_lookups(conn: Connection) -> Iterator[None]:
    """Inside, in ``conn``'s transaction, a join of a batch to a target runs as a nested loop
    over the target's key index: the planner, without statistics of a freshly staged batch,
    would hash (or sort) the whole target to join a few thousand rows."""
    row = conn.execute(_JOIN_METHODS, ("off", "off")).fetchone()
    assert row is not None
    try:
        yield
    finally:
        if not conn.broken and conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
            conn.execute(_JOIN_METHODS, (row[0], row[1]))


def _counted_merge(conn: Connection, target: TableName, statement: sql.Composed) -> SinkResult:
    """Runs ``statement`` over the target's key (:func:`key_lookups`); its inserted and
    updated rows."""
    row = conn.execute(_XACT_COUNTS, (target.qualified,)).fetchone()
    assert row is not None
    with key_lookups(conn):
        merged = conn.execute(statement).rowcount
    after = conn.execute(_XACT_COUNTS, (target.qualified,)).fetchone()
    assert after is not None
    inserted = int(after[0]) - int(row[0])
    updated = int(after[1]) - int(row[1])
    if inserted + updated != merged or min(inserted, updated) < 0:
        raise _CountsDisagreeError(f"{inserted} + {updated} != {merged}")
    return SinkResult("merge", inserted, updated)


def _upsert(
    conn: Connection, plan: TablePlan, insert: sql.Composed, changes_only: bool
) -> SinkResult:
    """``INSERT ... ON CONFLICT DO UPDATE``: the merge where ``MERGE`` cannot be used.

    A row it inserted has no ``xmax``. A partitioned target cannot return that system column,
    so there a returned row counts as inserted when the statement's snapshot did not find its
    key in the target (a key a concurrent writer inserted meanwhile counts as inserted).
    """
    others = [c.name for c in plan.columns if c.name not in plan.target_key]
    action: sql.Composable
    if others and changes_only:
        action = sql.SQL("DO UPDATE SET {}").format(set_from("excluded", others))
    elif others:
        action = sql.SQL("DO UPDATE SET {} WHERE {}").format(
            set_from("excluded", others), _changed(plan, others, "t", "excluded")
        )
    else:
        action = sql.SQL("DO NOTHING")
    keys = column_list(plan.target_key)
    inserted: sql.Composable = sql.SQL("t.xmax = 0")
    if plan.partitioned_target:
        inserted = sql.SQL("NOT EXISTS (SELECT 1 FROM {} AS o WHERE ({}) = ({}))").format(
            plan.target.ident, aliased("o", plan.target_key), aliased("t", plan.target_key)
        )
    statement = sql.SQL(
        "WITH merged AS ({} ON CONFLICT ({}) {} RETURNING {} AS inserted) "
        "SELECT count(*) FILTER (WHERE inserted), count(*) FILTER (WHERE NOT inserted) "
        "FROM merged"
    ).format(insert, keys, action, inserted)
    row = conn.execute(statement).fetchone()
    assert row is not None
    return SinkResult("merge", int(row[0]), int(row[1]))


def default_pk_name(table: str) -> str:
    """``<table>_pkey``, with the table part cut to fit 63 bytes as PostgreSQL would."""
    room = MAX_IDENTIFIER_BYTES - len("_pkey")
    head = table.encode()[:room].decode(errors="ignore")
    return f"{head}_pkey"
