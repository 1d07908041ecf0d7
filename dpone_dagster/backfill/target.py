"""Destination expansion: create the backfill's target table from the source when it is missing.

The copier refuses a target that does not match the source (``destination_expansion_incomplete``);
this step makes the common case work without hand-written DDL: a missing target is created with
the source's columns (types, NOT NULL, constant defaults; generated columns as generated), its
primary key, and an index on the cursor when the key does not start with it. An existing target
is never altered: if it differs, the copier's check reports exactly how.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from dpone_dagster.core.errors import engine_error
from dpone_dagster.postgres.catalog import column_list, primary_key, relation_oid, table_columns
from dpone_dagster.postgres.connection import ConnectionOptions, connect, set_transaction_mode
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.staging import ensure_schema, table_definition


def prepare_target(
    source_dsn: str,
    target_dsn: str,
    source: TableName,
    target: TableName,
    cursor: str,
    *,
    options: ConnectionOptions | None = None,
) -> bool:
    """Creates ``target`` shaped like ``source`` if it does not exist yet.

    Two orchestrators racing here are safe: the creation takes a transaction-scoped advisory
    lock on the target's name and re-checks under it.

    Returns:
        True when the table was created, False when it already existed.

    Raises:
        EngineError: ``plan_invalid`` when the source table does not exist or has no primary
            key (the copier could not match rows without one).
    """
    with connect(source_dsn, options, side="source") as src:
        set_transaction_mode(src, psycopg.IsolationLevel.REPEATABLE_READ, read_only=True)
        if relation_oid(src, source) is None:
            raise engine_error("plan_invalid", f"Source table {source} does not exist.")
        columns = table_columns(src, source)
        key = primary_key(src, source)
    if not key:
        raise engine_error(
            "plan_invalid", f"Table {source} has no primary key; rows need one to be matched."
        )
    with connect(target_dsn, options, side="target") as tgt:
        set_transaction_mode(tgt, psycopg.IsolationLevel.READ_COMMITTED, read_only=False)
        with tgt.transaction():
            lock = f"dpone:{target.qualified}"
            # psycopg has no API for advisory locks: this one ends with the transaction.
            tgt.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock,))
            if relation_oid(tgt, target) is not None:
                return False
            ensure_schema(tgt, target.schema)
            tgt.execute(
                sql.SQL("CREATE TABLE {} ({}, PRIMARY KEY ({}))").format(
                    target.ident, table_definition(columns), column_list(key)
                )
            )
            if key[0] != cursor:
                tgt.execute(
                    sql.SQL("CREATE INDEX ON {} ({})").format(target.ident, sql.Identifier(cursor))
                )
    return True
