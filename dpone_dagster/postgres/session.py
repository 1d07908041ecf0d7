"""Source sessions as live sources: the transaction an artifact's terminal decision ends."""

from __future__ import annotations

import threading
from collections.abc import Iterable

import psycopg
from psycopg.rows import TupleRow

from .connection import Connection


class SourceTransaction:
    """A live source transaction (and its cursors) that a terminal decision commits or rolls back.

    Implements :class:`dpone_dagster.lifecycle.LiveSource`. Cursors close first, then the
    transaction ends, then the session closes. Both methods are idempotent, and both close the
    session even when COMMIT or ROLLBACK fails (a failure is re-raised for the terminal authority
    to record).

    Args:
        conn: The source session holding the transaction.
        cursors: Server-side or client cursors opened in that transaction.
        close_connection: Close the session at the end (False when a pool owns it).
    """

    def __init__(
        self,
        conn: Connection,
        cursors: Iterable[psycopg.Cursor[TupleRow]] = (),
        *,
        close_connection: bool = True,
    ) -> None:
        self.conn = conn
        self.cursors = list(cursors)
        self.close_connection = close_connection
        self._lock = threading.Lock()
        self._ended: str | None = None

    @property
    def closed(self) -> bool:
        """True when the transaction has ended."""
        return self._ended is not None

    @property
    def ended_with(self) -> str | None:
        """``commit`` or ``rollback`` once ended."""
        return self._ended

    def add_cursor(self, cursor: psycopg.Cursor[TupleRow]) -> None:
        """Registers a cursor to close before the transaction ends."""
        self.cursors.append(cursor)

    def _end(self, action: str) -> None:
        with self._lock:
            if self._ended is not None:
                return
            self._ended = action
            error: BaseException | None = None
            for cursor in self.cursors:
                try:
                    cursor.close()
                except psycopg.Error as exc:
                    error = error or exc
            try:
                if not self.conn.closed:
                    if action == "commit":
                        self.conn.commit()
                    else:
                        self.conn.rollback()
            except psycopg.Error as exc:
                error = error or exc
            finally:
                if self.close_connection:
                    self.conn.close()
            if error is not None:
                raise error

    def commit_and_close(self) -> None:
        """Closes the cursors, commits the transaction and closes the session."""
        self._end("commit")

    def rollback_and_close(self) -> None:
        """Closes the cursors, rolls the transaction back and closes the session."""
        self._end("rollback")

    def close(self) -> None:
        """Closes the session without ending the transaction politely (server rolls back)."""
        self.conn.close()
