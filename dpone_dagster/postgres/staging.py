"""Staging tables: where a load writes its rows in the target before a sink applies them.

A staging table is created (and on any failure before its handover, dropped) under the
lifecycle's staging guard (:func:`~dpone_dagster.lifecycle.owned_staging_handle`). Its shape
depends on the sink: a table that will be swapped in as the target carries the target's full
definition; one whose rows are inserted into the target holds just the copied columns.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence

import psycopg
from psycopg import pq, sql

from dpone_dagster.lifecycle import DponeError, redact

from .catalog import Column, column_type
from .connection import Connection, ConnectionOptions, SessionError, connect, describe_dsn
from .identifiers import TableName
from .target_plan import TablePlan

# Everything a swapped-in table must keep from the old one, except indexes (built after the
# load, which is faster) and identity (a swap never replaces a table that has one).
_LIKE_TARGET = sql.SQL(
    "LIKE {} INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING CONSTRAINTS INCLUDING STORAGE "
    "INCLUDING COMPRESSION INCLUDING COMMENTS"
)


class StagingDropError(DponeError):
    """A staging table could not be dropped (attached as a note to the primary error)."""


def staging_name_for(target: TableName, *, tag: str | None = None) -> TableName:
    """Returns a unique staging name in the target's schema, short enough for PostgreSQL.

    The name is ``_dpone_stg_<random>`` so that it never depends on the target's (possibly long,
    quoted, unicode) name and can never collide with it.
    """
    suffix = tag or uuid.uuid4().hex[:16]
    return TableName(target.schema, f"_dpone_stg_{suffix}")


class PostgresStagingTable:
    """A staging table on a target session, shaped like a target or by explicit columns.

    ``create`` runs in the session's current transaction. ``drop`` is only called on a failure
    path, so it abandons any open transaction of the session first (rolling back its half-done
    load), then drops the table in a transaction of its own. If the session itself is broken (a
    terminated backend, a lost socket) and a DSN was given, it drops the table from a fresh
    session; a failure there is raised as :class:`StagingDropError` with the DSN redacted.

    Args:
        conn: The target session.
        name: The staging table's exact name.
        columns: Column definitions; when omitted the table is ``LIKE like``.
        like: A table to copy the column shape from (``INCLUDING DEFAULTS`` is not used:
            staging holds exactly what the source sent).
        unlogged: Create an ``UNLOGGED`` table (no WAL for rows that are thrown away).
        storage: Storage parameters, ``name=value`` as ``pg_class.reloptions`` spells them.
        dsn: The target DSN, for dropping from a fresh session when ``conn`` is broken.
        temporary: Create a ``TEMPORARY`` table instead (``name`` in the schema ``pg_temp``):
            no WAL and no file sync at its creation (an ``UNLOGGED`` table syncs its init
            fork), gone with its session; for staging that lives in one session's transaction.
    """

    def __init__(
        self,
        conn: Connection,
        name: TableName,
        *,
        columns: sql.Composable | None = None,
        like: TableName | None = None,
        unlogged: bool = True,
        storage: Sequence[str] = (),
        dsn: str | None = None,
        temporary: bool = False,
    ) -> None:
        if (columns is None) == (like is None):
            raise ValueError("give exactly one of columns= or like=")
        if temporary and name.schema != "pg_temp":
            raise ValueError("a temporary staging table is named in the schema pg_temp")
        self.conn = conn
        self.name = name
        self.columns = columns
        self.like = like
        self.unlogged = unlogged
        self.storage = tuple(storage)
        self.dsn = dsn
        self.temporary = temporary

    @property
    def display_name(self) -> str:
        """The staging table's qualified name."""
        return self.name.qualified

    def create(self) -> None:
        """Creates the staging table in the session's current transaction."""
        kind = sql.SQL("UNLOGGED TABLE") if self.unlogged else sql.SQL("TABLE")
        if self.temporary:
            kind = sql.SQL("TEMPORARY TABLE")
        if self.like is not None:
            body: sql.Composable = sql.SQL("(LIKE {})").format(self.like.ident)
        else:
            assert self.columns is not None
            body = sql.SQL("({})").format(self.columns)
        if self.storage:
            body = sql.SQL("{} WITH ({})").format(body, storage_clause(self.storage))
        self.conn.execute(sql.SQL("CREATE {} {} {}").format(kind, self.name.ident, body))

    def _drop_statement(self) -> sql.Composed:
        return sql.SQL("DROP TABLE IF EXISTS {}").format(self.name.ident)

    def drop(self) -> None:
        """Drops the staging table, from a fresh session if this one is broken."""
        try:
            if not self.conn.closed and not self.conn.broken:
                status = self.conn.info.transaction_status
                if status in (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR):
                    self.conn.rollback()
                # One statement in autocommit: its own transaction, nothing else in it.
                autocommit = self.conn.autocommit
                self.conn.autocommit = True
                try:
                    self.conn.execute(self._drop_statement())
                finally:
                    self.conn.autocommit = autocommit
                return
        except psycopg.Error as first:
            if self.dsn is None:
                raise StagingDropError(
                    "staging_drop_failed",
                    f"Could not drop staging table {self.display_name}: {redact(str(first))}",
                    ["Drop the table by hand once the target answers."],
                ) from None
        if self.dsn is None:
            raise StagingDropError(
                "staging_drop_failed",
                f"Could not drop staging table {self.display_name}: the session is closed.",
                ["Drop the table by hand, or give the staging table the target DSN."],
            )
        try:
            options = ConnectionOptions(connect_timeout=5)
            with connect(self.dsn, options, side="target", autocommit=True) as fresh:
                fresh.execute(self._drop_statement())
        except (psycopg.Error, SessionError) as exc:
            raise StagingDropError(
                "staging_drop_failed",
                f"Could not drop staging table {self.display_name} on {describe_dsn(self.dsn)} "
                f"(DSN {redact(self.dsn)}): {redact(str(exc))}",
                ["Drop the table by hand once the target answers."],
            ) from None


_STORAGE_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def storage_clause(storage: Sequence[str]) -> sql.Composed:
    """``name = 'value', ...`` for a ``WITH (...)`` clause, from ``name=value`` parameters.

    Raises:
        ValueError: a parameter that is not ``name=value`` with a plain lower-case name.
    """
    parts = []
    for parameter in storage:
        name, equals, value = parameter.partition("=")
        if not equals or not _STORAGE_NAME.fullmatch(name):
            raise ValueError(f"not a storage parameter: {parameter!r}")
        parts.append(sql.SQL("{} = {}").format(sql.SQL(name), sql.Literal(value)))
    return sql.SQL(", ").join(parts)


def table_definition(columns: Sequence[Column], *, constraints: bool = True) -> sql.Composed:
    """Column definitions: name and type, plus (with ``constraints``) generation expression
    (``VIRTUAL`` or ``STORED``), constant default and NOT NULL, as the catalog describes them."""
    definitions = []
    for column in columns:
        parts: list[sql.Composable] = [column.ident, column_type(column)]
        if constraints and column.generation_sql is not None:
            kind = sql.SQL("VIRTUAL" if column.virtual else "STORED")
            parts.append(
                sql.SQL("GENERATED ALWAYS AS ({}) {}").format(sql.SQL(column.generation_sql), kind)
            )
        elif constraints and column.default_sql is not None:
            parts.append(sql.SQL("DEFAULT {}").format(sql.SQL(column.default_sql)))
        if constraints and column.not_null:
            parts.append(sql.SQL("NOT NULL"))
        definitions.append(sql.SQL(" ").join(parts))
    return sql.SQL(", ").join(definitions)


def staging_table(conn: Connection, plan: TablePlan, *, dsn: str) -> PostgresStagingTable:
    """The staging table for ``plan``, in the target's schema, not yet created.

    A staging table that will become the target carries the target's full definition (the
    source's, for a target created by this copy) and is as durable as the target; one whose
    rows are inserted into the target holds just the copied columns and is ``UNLOGGED``. One
    that becomes the target takes the plan's storage parameters.
    """
    name = staging_name_for(plan.target)
    if not plan.target_exists:
        return PostgresStagingTable(
            conn, name, columns=table_definition(plan.source_columns), unlogged=False,
            storage=plan.storage, dsn=dsn,
        )  # fmt: skip
    if plan.swap:
        return PostgresStagingTable(
            conn,
            name,
            columns=_LIKE_TARGET.format(plan.target.ident),
            unlogged=plan.unlogged_target,
            storage=plan.storage,
            dsn=dsn,
        )
    return PostgresStagingTable(
        conn, name, columns=table_definition(plan.written, constraints=False), dsn=dsn
    )
