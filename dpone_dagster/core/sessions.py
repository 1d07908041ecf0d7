"""The engines' sessions: how each transaction begins, and how a failure ends them all.

Every engine session is opened in autocommit mode, so nothing is inside a transaction until
:func:`transaction` begins one. It sets the isolation level and read-only mode on the connection
first, so psycopg's own ``BEGIN`` carries both; a ``conn.transaction()`` opened inside it is a
savepoint. Leaving the block commits; an exception (an interrupt too) rolls back on the way out.

What a ``with`` block cannot end (a session still busy with a COPY, or one whose connection
broke) :meth:`Sessions.abandon` ends: such a session is closed and the server rolls its
transaction back. Callers that hold several sessions call it on every failure, so no transaction
outlives a failed step.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from psycopg import IsolationLevel, pq

from dpone_dagster.postgres.connection import Connection, set_transaction_mode
from dpone_dagster.reconcile.digest import pin_settings


def prepare_session(conn: Connection) -> None:
    """Pins the settings that decide how cursor values and rows are spelled as text (the
    reconciliation digest's), for the whole session: the same value always has the same
    spelling in a checkpoint, a mark or a digest."""
    pin_settings(conn, local=False)


@contextmanager
def transaction(
    conn: Connection, isolation: IsolationLevel, *, read_only: bool
) -> Iterator[Connection]:
    """Begins a transaction on the idle autocommit session ``conn``; commits when the block ends.

    Args:
        conn: An autocommit session with no transaction open.
        isolation: The transaction's isolation level.
        read_only: Begin it ``READ ONLY`` (else ``READ WRITE``).

    Yields:
        ``conn``, inside the transaction.
    """
    set_transaction_mode(conn, isolation, read_only=read_only)
    with conn.transaction():
        yield conn


def advisory_xact_lock(conn: Connection, key: str) -> None:
    """Takes the advisory lock named ``key`` until ``conn``'s transaction ends (waits while
    another transaction holds it)."""
    # psycopg has no API for advisory locks: a transaction-scoped one, released at its end.
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (key,))


@dataclass
class Sessions:
    """An engine run's autocommit sessions; ``ledger`` is ``target`` when the ledger is there."""

    source: Connection
    target: Connection
    ledger: Connection

    @property
    def ledger_in_target(self) -> bool:
        """True when rows and receipt share one transaction."""
        return self.ledger is self.target

    def _distinct(self) -> list[Connection]:
        return list({id(c): c for c in (self.source, self.target, self.ledger)}.values())

    def abandon(self) -> None:
        """Ends any open transaction; a session that cannot answer is closed (server rolls back)."""
        for conn in self._distinct():
            if conn.closed:
                continue
            status = conn.info.transaction_status
            if status is pq.TransactionStatus.IDLE:
                continue
            try:
                if conn.broken or status is pq.TransactionStatus.ACTIVE:
                    raise psycopg.OperationalError("session busy or broken")
                conn.rollback()
            except psycopg.Error:
                conn.close()

    def close(self) -> None:
        """Closes every session (the server rolls back any transaction still open)."""
        for conn in self._distinct():
            conn.close()
