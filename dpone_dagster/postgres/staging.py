"""Staging tables on the PostgreSQL target, created and dropped under the lifecycle guard."""

from __future__ import annotations

import uuid

import psycopg
from psycopg import pq, sql

from dpone_dagster.lifecycle import DponeError, redact

from .connection import ConnectionOptions, connect, describe_dsn
from .identifiers import TableName


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
        dsn: The target DSN, for dropping from a fresh session when ``conn`` is broken.
    """

    def __init__(
        self,
        conn: psycopg.Connection[tuple[object, ...]],
        name: TableName,
        *,
        columns: sql.Composable | None = None,
        like: TableName | None = None,
        unlogged: bool = True,
        dsn: str | None = None,
    ) -> None:
        if (columns is None) == (like is None):
            raise ValueError("give exactly one of columns= or like=")
        self.conn = conn
        self.name = name
        self.columns = columns
        self.like = like
        self.unlogged = unlogged
        self.dsn = dsn

    @property
    def display_name(self) -> str:
        """The staging table's qualified name."""
        return self.name.qualified

    def create(self) -> None:
        """Creates the staging table in the session's current transaction."""
        kind = sql.SQL("UNLOGGED TABLE") if self.unlogged else sql.SQL("TABLE")
        if self.like is not None:
            body: sql.Composable = sql.SQL("(LIKE {})").format(self.like.ident)
        else:
            assert self.columns is not None
            body = sql.SQL("({})").format(self.columns)
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
            with connect(self.dsn, ConnectionOptions(connect_timeout=5), autocommit=True) as fresh:
                fresh.execute(self._drop_statement())
        except psycopg.Error as exc:
            raise StagingDropError(
                "staging_drop_failed",
                f"Could not drop staging table {self.display_name} on {describe_dsn(self.dsn)} "
                f"(DSN {redact(self.dsn)}): {redact(str(exc))}",
                ["Drop the table by hand once the target answers."],
            ) from None
