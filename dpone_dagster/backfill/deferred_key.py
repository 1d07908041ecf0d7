"""The deferred key: a target the backfill created gets its primary key once its rows are in.

A row written into a table that has its key costs an index insertion and the WAL record of
that insertion. The same key built once, after the rows, sorts them once and writes each index
page once: the snapshot copy loads this way (``COPY`` then ``ADD PRIMARY KEY``), and a backfill
that loaded into the keyed table wrote twice the snapshot copy's WAL for the same rows.

So a backfill whose step creates its target may create it without the key, mark it, append its
batches into it, then build the key before anything reads a range by it:

1. :func:`~dpone_dagster.backfill.prepare_target` with ``defer_key=True`` creates the table
   without its primary key and, in the same transaction, sets the table's comment to the
   marker (:func:`marker`, naming the key's columns).
2. The run that created it (a :class:`~dpone_dagster.backfill.Backfill` with
   ``keyless_load=True``) appends each batch by one ``COPY`` straight into the table: no
   savepoint and no probe of the range, so its rows carry the batch transaction's own id, the
   row-version evidence without reading a row back (:func:`~dpone_dagster.postgres.evidence.
   own_writes`); its count is the ``COPY``'s command tag.
3. :func:`build_key` adds the key and clears the marker in one transaction: the step calls it
   once every partition's batches reached their marks, before the reconciliations; any other
   use of the table (another run, a retry after a crash, a reconciliation) calls it first
   (:meth:`~dpone_dagster.backfill.Backfill.plan`), so nothing reads a range without its index.

Why a keyless table cannot receive a key twice from the backfill: the key is only deferred when
the cursor is the whole primary key, so each source row falls in exactly one batch range; the
ledger lives in the target, so a batch's rows and its receipt commit together; and the run's
compare-and-swap, under its lock, admits each range once. A row put in by hand that duplicates
a key makes :func:`build_key` fail with ``backfill_key_duplicated``: nothing is removed, the
marker stays, the message shows duplicated keys. A row put in by hand that duplicates no key is
found by the final reconciliation, as in a keyed target.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import psycopg
from psycopg import sql

from dpone_dagster.core.errors import engine_error
from dpone_dagster.postgres.catalog import column_list
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName

MARKER = "dpone: the primary key is built once the backfill's rows are in: "
"""How the marker comment starts; the key's columns follow as a JSON list."""

_READ = """SELECT obj_description(c.oid, 'pg_class'),
    EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND c.relkind = 'r'"""


def marker(key: Sequence[str]) -> str:
    """The comment that marks a table whose primary key ``key`` is deferred."""
    return MARKER + json.dumps(list(key))


def deferred_key(conn: Connection, table: TableName) -> tuple[str, ...] | None:
    """The columns of ``table``'s deferred primary key; ``None`` when it is not deferred (no
    marker, the key exists, or no such table)."""
    row = conn.execute(_READ, (table.schema, table.name)).fetchone()
    if row is None or row[1] or not isinstance(row[0], str) or not row[0].startswith(MARKER):
        return None
    return tuple(json.loads(row[0][len(MARKER) :]))


def mark_deferred(conn: Connection, table: TableName, key: Sequence[str]) -> None:
    """Marks ``table`` (created without its key in the open transaction) as deferring ``key``."""
    conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(table.ident, sql.Literal(marker(key))))


def build_key(conn: Connection, table: TableName) -> bool:
    """Adds ``table``'s deferred primary key and clears its marker, in one transaction; nothing
    when the key is not deferred (built by another session meanwhile, or never deferred).

    A table whose key is not deferred costs one catalog read, without a transaction. Two
    sessions racing here are safe: the build takes the advisory lock
    :func:`~dpone_dagster.backfill.prepare_target` creates under, and reads the marker again
    under it. ``ADD PRIMARY KEY`` waits for the batches open on the table (its lock is
    ``ACCESS EXCLUSIVE``) and the batches that follow wait for it.

    Returns:
        True when this call built the key.

    Raises:
        EngineError: ``backfill_key_duplicated`` when the table holds a key twice (rows put in
            by hand); nothing is changed, the marker stays.
    """
    if deferred_key(conn, table) is None:
        return False
    with conn.transaction():
        # psycopg has no API for advisory locks: this one ends with the transaction.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"dpone:{table.qualified}",))
        key = deferred_key(conn, table)
        if key is None:
            return False
        try:
            with conn.transaction():  # a savepoint: a failed build leaves the table readable
                conn.execute(
                    sql.SQL("ALTER TABLE {} ADD PRIMARY KEY ({})").format(
                        table.ident, column_list(key)
                    )
                )
        except psycopg.errors.UniqueViolation:
            raise engine_error(
                "backfill_key_duplicated",
                f"Target {table} holds keys ({', '.join(key)}) more than once, so its primary "
                f"key, deferred while the backfill loaded it, cannot be built: for example "
                f"{_duplicates(conn, table, key)}. Nothing was changed.",
            ) from None
        conn.execute(sql.SQL("COMMENT ON TABLE {} IS NULL").format(table.ident))
    return True


def _duplicates(conn: Connection, table: TableName, key: Sequence[str], limit: int = 3) -> str:
    """A few keys ``table`` holds more than once, with how many times."""
    cols = column_list(key)
    rows = conn.execute(
        sql.SQL(
            "SELECT ({})::text, count(*) FROM {} GROUP BY {} HAVING count(*) > 1 LIMIT %s"
        ).format(cols, table.ident, cols),
        (limit,),
    ).fetchall()
    return ", ".join(f"{r[0]} ({r[1]} rows)" for r in rows)
