"""The one ``COPY`` a target session runs into a staging table at a time (:class:`StagingCopy`)."""

from __future__ import annotations

import contextlib
from contextlib import ExitStack

import psycopg
from psycopg import sql

from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName


class StagingCopy:
    """The one ``COPY`` a target session runs into a staging table, kept open while that
    table's rows stream in, so that the server writes them while the next ones are decoded.

    A session runs one statement at a time: whatever else it runs (another table's staging,
    the net effect, the ledger, a plan's catalog reads) ends the open ``COPY`` first
    (:meth:`end`).
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._into: TableName | None = None
        self._copy: psycopg.Copy | None = None
        self._stack = ExitStack()

    def write(self, into: TableName, statement: sql.Composed, data: bytes) -> None:
        """Writes ``data`` into the ``COPY`` of ``statement`` into ``into`` (started here, the
        open one into another table ended first)."""
        if self._into != into:
            self.end()
            self._copy = self._stack.enter_context(self.conn.cursor().copy(statement))
            self._into = into
        assert self._copy is not None
        self._copy.write(data)

    def end(self) -> None:
        """Ends the open ``COPY``, if any: its rows are in its staging table."""
        if self._into is not None:
            self._into, self._copy = None, None
            self._stack.close()

    def abandon(self) -> None:
        """On a failure: the open ``COPY`` fails (its transaction is rolled back after)."""
        if self._into is not None:
            self._into, self._copy = None, None
            with contextlib.suppress(psycopg.Error):
                self._stack.__exit__(RuntimeError, RuntimeError("abandoned"), None)
