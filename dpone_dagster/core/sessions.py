"""The engines' sessions: how each transaction begins, and how a failure ends them all.

Every engine session is opened in autocommit mode, so nothing is inside a transaction until
:func:`transaction` begins one. It sets the isolation level and read-only mode on the connection
first, so psycopg's own ``BEGIN`` carries both; a ``conn.transaction()`` opened inside it is a
savepoint. Leaving the block commits; an exception (an interrupt too) rolls back on the way out.

What a ``with`` block cannot end (a session still busy with a COPY, or one whose connection
broke) :meth:`Sessions.abandon` ends: such a session is closed and the server rolls its
transaction back. Callers that hold several sessions call it on every failure, so no transaction
outlives a failed step; an engine's run ends through :func:`fail_run`, which does that and codes a
database error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import wait
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NoReturn

import psycopg
from psycopg import IsolationLevel, pq

from dpone_dagster.core.errors import engine_error
from dpone_dagster.core.waits import wait_while
from dpone_dagster.lifecycle import DponeError, redact
from dpone_dagster.postgres.connection import (
    Connection,
    ConnectionOptions,
    Side,
    connect,
    set_transaction_mode,
)
from dpone_dagster.postgres.failures import FailureSide, database_error, denied_object
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.threads import background
from dpone_dagster.reconcile.digest import DIGEST_SETTINGS


def prepared_session(
    dsn: str, options: ConnectionOptions | None, side: Side, *, autocommit: bool = True
) -> Connection:
    """A new engine session, idle in no transaction, with the settings that decide how cursor
    values and rows are spelled as text (the reconciliation digest's,
    :data:`~dpone_dagster.reconcile.digest.DIGEST_SETTINGS`) pinned for the whole session: the
    same value always has the same spelling in a checkpoint, a mark or a digest. They travel in
    the session's startup packet: no round trip of their own, and a ``RESET`` returns to them.

    Args:
        dsn: The database's DSN.
        options: Its session options.
        side: Which side it is (in the errors of its connection).
        autocommit: Open it in autocommit mode (the engines' rule, :func:`transaction`); a
            session opened without it begins its first transaction at its first statement.
    """
    return connect(dsn, options, side=side, autocommit=autocommit, settings=DIGEST_SETTINGS)


def open_at_once(*openers: Callable[[], Connection]) -> list[Connection]:
    """The sessions ``openers`` open, opened concurrently, in their order: each start is a new
    server process's (its authentication and first catalog reads), and a run with little to do
    is mostly its sessions' starts.

    Raises:
        BaseException: The first failure of an opener (or an interrupt while they run), once
            every opener has ended; the sessions the others opened are closed.
    """
    interrupted: BaseException | None = None
    started = [background().submit(opener) for opener in openers]
    try:
        wait(started)
    except BaseException as exc:  # every opener still ends before its session is closed
        interrupted = exc
        wait(started)
    failures = [f.exception() for f in started if f.exception() is not None]
    failure = interrupted or (failures[0] if failures else None)
    if failure is not None:
        for future in started:
            if future.exception() is None:
                future.result().close()
        raise failure
    return [future.result() for future in started]


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
        try:
            yield conn
        except psycopg.Error as exc:
            note_failed_session(exc, conn)
            raise


@contextmanager
def one_statement(conn: Connection) -> Iterator[Connection]:
    """A block that runs one read on the idle session ``conn``. On an autocommit session the
    statement is its own transaction: no ``BEGIN`` and ``COMMIT`` (two round trips) around it,
    and a failure is noted on its error as :func:`transaction` notes it. On a session without
    autocommit it runs in a read-only transaction that ends with the block (a failed statement
    leaves the session idle, not in a failed transaction).

    Yields:
        ``conn``.
    """
    if not conn.autocommit:
        with transaction(conn, IsolationLevel.READ_COMMITTED, read_only=True):
            yield conn
        return
    try:
        yield conn
    except psycopg.Error as exc:
        note_failed_session(exc, conn)
        raise


_FAILED_ON = "_dpone_failed_session"


def note_failed_session(exc: psycopg.Error, conn: Connection) -> None:
    """Records on ``exc`` that ``conn`` raised it, while that can still be told (its transaction
    is aborted or its connection broken; the ``with`` block's rollback ends both), unless a
    session nearer the failure did already: :meth:`Sessions.database_failure` reads it."""
    failed = conn.broken or conn.info.transaction_status is pq.TransactionStatus.INERROR
    if failed and getattr(exc, _FAILED_ON, None) is None:
        setattr(exc, _FAILED_ON, conn)


def advisory_xact_lock(conn: Connection, key: str) -> None:
    """Takes the advisory lock named ``key`` until ``conn``'s transaction ends (waits while
    another transaction holds it)."""
    # psycopg has no API for advisory locks: a transaction-scoped one, released at its end.
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (key,))


_HOLDERS = (
    # A bigint advisory key is held as classid (its high half) and objid (its low half).
    "SELECT l.pid FROM pg_catalog.pg_locks AS l WHERE l.locktype = 'advisory' AND l.granted"
    " AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_catalog.pg_database"
    " WHERE datname = current_database())"
    " AND l.classid::int8 = (hashtextextended(%(key)s, 0) >> 32) & 4294967295"
    " AND l.objid::int8 = hashtextextended(%(key)s, 0) & 4294967295"
    " AND l.pid <> pg_backend_pid()"
)


def hold_advisory_lock(
    conn: Connection,
    key: str,
    *,
    timeout: float,
    timed_out: Callable[[int], Exception],
    on_wait: Callable[[int], None] | None = None,
) -> float:
    """Takes the advisory lock named ``key`` for ``conn``'s session (released by
    :func:`release_advisory_lock`, or when the session ends), waiting at most ``timeout``
    seconds while another session holds it.

    Args:
        conn: An autocommit session.
        key: The lock's name (the one :func:`advisory_xact_lock` takes: the two exclude each
            other across sessions).
        timeout: Seconds to wait for it.
        timed_out: Builds the error raised past ``timeout``, from the holder's pid (0 when it
            could not be read).
        on_wait: Called once, with the holder's pid, when the lock is held by another session.

    Returns:
        The seconds waited.

    Raises:
        Exception: ``timed_out(pid)``, past ``timeout``.
    """
    take = "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))"
    told = False

    def holders() -> list[int]:
        row = conn.execute(take, (key,)).fetchone()
        if row is not None and row[0]:
            return []
        pids = [int(r[0]) for r in conn.execute(_HOLDERS, {"key": key})]
        nonlocal told
        if not told and on_wait is not None:
            told = True
            on_wait(pids[0] if pids else 0)
        return pids or [0]  # released between the two reads: try again

    return wait_while(holders, timeout=timeout, interval=0.1, timed_out=lambda p: timed_out(p[0]))


def release_advisory_lock(conn: Connection, key: str) -> None:
    """Releases the session's advisory lock named ``key`` (:func:`hold_advisory_lock`)."""
    conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))


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

    def abandon(self, failure: BaseException | None = None) -> None:
        """Ends any open transaction; a session that cannot answer is closed (server rolls back).

        Args:
            failure: What ended the run: a database error is first noted with the session that
                raised it (:func:`note_failed_session`), which the rollbacks would hide.
        """
        if isinstance(failure, psycopg.Error):
            for conn in self._distinct():
                note_failed_session(failure, conn)
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

    def failed_side(self, exc: psycopg.Error, sources: Sequence[TableName] = ()) -> FailureSide:
        """Which side raised ``exc``: the session :func:`note_failed_session` recorded, else a
        broken or aborted session, else (a privilege error) the side whose table it names;
        the target when nothing tells (read before :meth:`abandon` ends the transactions)."""
        noted = getattr(exc, _FAILED_ON, None)
        if noted is not None:
            return "source" if noted is self.source else "target"
        for conn in (self.source, self.target, self.ledger):
            if conn.broken or conn.info.transaction_status is pq.TransactionStatus.INERROR:
                return "source" if conn is self.source else "target"
        named = denied_object(exc)
        if named is not None and named in {t.name for t in sources}:
            return "source"
        return "target"

    def database_failure(
        self,
        exc: psycopg.Error,
        outage: DponeError,
        *,
        sources: Sequence[TableName] = (),
        targets: Sequence[TableName] = (),
    ) -> DponeError:
        """The stable error of a database failure of an engine run: ``<side>_permission_denied``
        and the other kinds of :func:`~dpone_dagster.postgres.failures.database_error`, else
        the engine's ``outage`` (``backfill_persistence_failed``, ``incremental_failed``)."""
        side = self.failed_side(exc, sources)
        conn = self.source if side == "source" else self.target
        return database_error(exc, side, outage=outage, conn=conn, known=[*sources, *targets])

    def close(self) -> None:
        """Closes every session (the server rolls back any transaction still open)."""
        for conn in self._distinct():
            conn.close()


def fail_run(
    sessions: Sessions,
    exc: BaseException,
    outage: str,
    *,
    sources: Sequence[TableName] = (),
    targets: Sequence[TableName] = (),
) -> NoReturn:
    """Ends an engine run that raised ``exc`` (called in its ``except BaseException``): the
    sessions are abandoned (:meth:`Sessions.abandon`) and the failure raised again; a database
    error is raised as its stable error (:meth:`Sessions.database_failure`, read before the
    rollbacks; the engine's ``outage`` code when the catalog names no kind), chained to it.

    Args:
        sessions: The run's sessions (the caller closes them in its ``finally``).
        exc: What the run raised (an interrupt too).
        outage: The engine's code of a database outage (``replication_failed``,
            ``incremental_failed``).
        sources: The run's source tables (a privilege error naming one is the source's).
        targets: Its target tables.

    Raises:
        DponeError: for a ``psycopg.Error``.
        BaseException: ``exc`` itself, for any other failure.
    """
    if isinstance(exc, psycopg.Error):
        coded = engine_error(outage, redact(str(exc)).strip())
        error = sessions.database_failure(exc, coded, sources=sources, targets=targets)
        sessions.abandon()
        raise error from exc
    sessions.abandon()
    raise exc
