"""Destination expansion: create the backfill's target table from the source when it is missing.

The copier refuses a target that does not match the source (``destination_expansion_incomplete``);
this step makes the common case work without hand-written DDL: a missing target is created with
the source's columns (types, NOT NULL, constant defaults; generated columns as generated, a
``VIRTUAL`` one as ``STORED`` on a server before PostgreSQL 18), its primary key (or, with
``defer_key`` and a cursor that is the whole key, the marker of a key built once the rows are in:
:mod:`.deferred_key`), and an index on the cursor when the key does not start with it,
together with the user-defined types its columns need
(:mod:`dpone_dagster.postgres.target_types`: created in the same transaction, enum labels the
source gained added; the extensions they come from only when named in ``create_extensions``).
An existing target is never altered: if it differs, the copier's check reports exactly how.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from dpone_dagster.core.errors import engine_error
from dpone_dagster.cursor.table_check import FIXED_MARK_CHECK
from dpone_dagster.lifecycle import redact
from dpone_dagster.postgres.catalog import Column, column_list, ensure_schema, relation_oid
from dpone_dagster.postgres.connection import (
    Connection,
    ConnectionOptions,
    connect,
    set_transaction_mode,
)
from dpone_dagster.postgres.failures import FailureSide, coded_failures
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.privileges import require_schema
from dpone_dagster.postgres.schema_change import SchemaChanges
from dpone_dagster.postgres.staging import table_definition
from dpone_dagster.postgres.target_plan import generated_as_target_can
from dpone_dagster.postgres.target_types import (
    TargetTypes,
    add_enum_labels,
    create_types,
    plan_types,
)
from dpone_dagster.postgres.user_types import source_types

from .deferred_key import mark_deferred


@dataclass(frozen=True)
class PreparedTarget:
    """What :func:`prepare_target` did (true when it created the table).

    Attributes:
        created: The table was created.
        target_types: What was created for its types (extensions, types, enum labels).
        virtual_as_stored: The source's ``VIRTUAL`` generated columns the table defines as
            ``STORED`` (a target before PostgreSQL 18).
        deferred_key: The table was created without its primary key, marked to get it once
            the rows are in (:mod:`.deferred_key`).
    """

    created: bool
    target_types: TargetTypes = field(default_factory=TargetTypes)
    virtual_as_stored: tuple[str, ...] = ()
    deferred_key: bool = False

    def __bool__(self) -> bool:
        return self.created


def prepare_target(
    source_dsn: str,
    target_dsn: str,
    source: TableName,
    target: TableName,
    cursor: str,
    *,
    options: ConnectionOptions | None = None,
    target_options: ConnectionOptions | None = None,
    create_extensions: Collection[str] = (),
    defer_key: bool = False,
) -> PreparedTarget:
    """Creates ``target`` shaped like ``source`` if it does not exist yet, with the types its
    columns need.

    With ``defer_key``, a table whose cursor is its whole primary key is created without the
    key and marked to get it once the rows are in (:mod:`.deferred_key`): only for a caller
    that loads it with ``Backfill(keyless_load=True)`` and a ledger in the target database,
    then calls :meth:`~dpone_dagster.backfill.Backfill.build_key`.

    Two orchestrators racing here are safe: the creation takes a transaction-scoped advisory
    lock on the target's name and re-checks under it.

    Returns:
        What was created (true when the table was, false when it already existed).

    Raises:
        EngineError: the source's refusals of the one table check
            (:func:`~dpone_dagster.cursor.table_check.check_source`), nothing created:
            ``plan_invalid`` when the source table does not exist, has no primary key (the
            copier could not match rows without one), or a cursor of a type that cannot order
            a backfill or that no index starts with; ``cursor_not_found`` when the cursor is
            not one of its columns.
        DatabaseError: ``source_permission_denied`` (no ``SELECT`` on the source table),
            ``target_permission_denied`` (the target's schema does not take new tables).
        TargetTypeError: a type the target defines otherwise, an extension it lacks
            (:func:`dpone_dagster.postgres.target_types.plan_types`).
    """
    with connect(source_dsn, options, side="source") as src, _coded("source", source):
        set_transaction_mode(src, psycopg.IsolationLevel.REPEATABLE_READ, read_only=True)
        found = FIXED_MARK_CHECK.source_catalog(src, source)
        needed = source_types(src, [c.type_oid for c in found.columns])
    tables = FIXED_MARK_CHECK.source(found, source, target, cursor)
    target_options = target_options or options
    with connect(target_dsn, target_options, side="target") as tgt, _coded("target", target):
        set_transaction_mode(tgt, psycopg.IsolationLevel.READ_COMMITTED, read_only=False)
        with tgt.transaction():
            lock = f"dpone:{target.qualified}"
            # psycopg has no API for advisory locks: this one ends with the transaction.
            tgt.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock,))
            if relation_oid(tgt, target) is not None:
                return PreparedTarget(False)
            require_schema(tgt, "target", target.schema)
            types = plan_types(
                tgt, needed, SchemaChanges.EVOLVE, table=str(target),
                create_extensions=create_extensions,
            )  # fmt: skip
            add_enum_labels(tgt, types.labels)  # no row uses them in this transaction
            create_types(tgt, [types])
            major = tgt.info.server_version // 10000
            definition, stored = generated_as_target_can(found.columns, major)
            deferred = defer_key and tables.key_names == (cursor,)
            key = () if deferred else tables.key_names
            _create_table(tgt, target, definition, key, cursor)
            if deferred:
                mark_deferred(tgt, target, tables.key_names)
    return PreparedTarget(True, types, stored, deferred_key=deferred)


def _coded(side: FailureSide, table: TableName) -> AbstractContextManager[None]:
    """A database failure of ``side``: its catalogued code, else ``backfill_persistence_failed``."""
    return coded_failures(
        side,
        outage=lambda exc: engine_error("backfill_persistence_failed", redact(str(exc)).strip()),
        known=[table],
    )


def _create_table(
    tgt: Connection, target: TableName, columns: Sequence[Column], key: Sequence[str], cursor: str
) -> None:
    """Creates the table with ``key`` as its primary key (none when empty: a deferred key, whose
    cursor is the key) and an index on the cursor when the key does not start with it."""
    ensure_schema(tgt, target.schema)
    primary = sql.SQL(", PRIMARY KEY ({})").format(column_list(key)) if key else sql.SQL("")
    tgt.execute(
        sql.SQL("CREATE TABLE {} ({}{})").format(target.ident, table_definition(columns), primary)
    )
    if key and key[0] != cursor:
        tgt.execute(sql.SQL("CREATE INDEX ON {} ({})").format(target.ident, sql.Identifier(cursor)))
