"""Snapshot sessions: a source transaction whose snapshot is known, exported and imported.

Every session here runs one ``REPEATABLE READ READ ONLY`` transaction (the session's
transaction mode, which psycopg puts in its ``BEGIN``). Its first
statement fixes the transaction's snapshot and, in the same statement, reads the server-issued
token (``pg_current_snapshot()`` or ``pg_export_snapshot()``) and the server's
``clock_timestamp()``: that pair is the :class:`SnapshotEvidence` a receipt may carry.

A coordinator that exported its snapshot lets any number of worker sessions import it with
``SET TRANSACTION SNAPSHOT``. PostgreSQL accepts no bind parameter there, so the server-issued
token is composed with :class:`psycopg.sql.Literal`; it never comes from user text.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable
from datetime import datetime

import psycopg
from psycopg import sql

from dpone_dagster.lifecycle import DponeError, SnapshotEvidence, redact

from .connection import Connection, ConnectionOptions, connect, set_transaction_mode
from .session import SourceTransaction

POSTGRES_CLOCK = "postgresql.clock_timestamp"
"""Clock authority of timestamps read from the server's ``clock_timestamp()``."""
CURRENT_SNAPSHOT = "postgresql.pg_current_snapshot"
"""Snapshot authority of a transaction's own snapshot (``pg_current_snapshot()``)."""
EXPORTED_SNAPSHOT = "postgresql.pg_export_snapshot"
"""Snapshot authority of a snapshot exported to worker sessions (``pg_export_snapshot()``)."""

# pg_export_snapshot() prints hex groups joined by dashes ("00000003-0000001B-1").
_TOKEN_SHAPE = re.compile(r"[0-9A-Fa-f]{1,16}(?:-[0-9A-Fa-f]{1,16}){1,3}")


class SnapshotError(DponeError):
    """A snapshot could not be taken, exported or imported."""


class SnapshotSession:
    """A source session inside a ``REPEATABLE READ READ ONLY`` transaction with a known snapshot.

    Open one with :meth:`open` (a coordinator), or :meth:`worker` / :meth:`import_snapshot` (a
    session that imports a coordinator's exported snapshot). The session is a live source:
    :attr:`transaction` is the :class:`SourceTransaction` that an artifact's terminal decision
    commits or rolls back and closes.

    Attributes:
        conn: The session (its transaction mode is ``REPEATABLE READ READ ONLY``).
        evidence: The snapshot's token, issuer and server time, for ``acquire_snapshot``.
        backend_pid: The server process serving this session.
        options: The options the session was opened with (workers reuse them).
    """

    def __init__(
        self,
        conn: Connection,
        evidence: SnapshotEvidence,
        backend_pid: int,
        *,
        dsn: str,
        options: ConnectionOptions,
    ) -> None:
        self.conn = conn
        self.evidence = evidence
        self.backend_pid = backend_pid
        self.options = options
        self._dsn = dsn
        self.transaction = SourceTransaction(conn)

    def __enter__(self) -> SnapshotSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def token(self) -> str:
        """The server-issued snapshot token (export it to other sessions when :attr:`exported`)."""
        return self.evidence.token

    @property
    def exported(self) -> bool:
        """True when the snapshot was exported (or imported) and workers can share it."""
        return self.evidence.authority == EXPORTED_SNAPSHOT

    @classmethod
    def open(
        cls, dsn: str, options: ConnectionOptions | None = None, *, export: bool = False
    ) -> SnapshotSession:
        """Opens a session, starts its read-only transaction and fixes its snapshot.

        Args:
            dsn: The source database.
            options: Connection options.
            export: Export the snapshot (``pg_export_snapshot()``) so worker sessions can
                import it; otherwise the token is ``pg_current_snapshot()``.

        Raises:
            SessionError: ``source_unreachable`` or ``source_login_failed``.
            SnapshotError: ``snapshot_unavailable`` when the server refuses the transaction.
        """
        options = options or ConnectionOptions()
        conn = _read_only_session(dsn, options)
        try:
            evidence, pid = read_snapshot(conn, export=export)
        except psycopg.Error as exc:
            conn.close()
            raise SnapshotError(
                "snapshot_unavailable",
                f"Could not open a read-only snapshot transaction: {redact(str(exc))}",
                ["Check that the source accepts connections and that the user may read."],
            ) from None
        return cls(conn, evidence, pid, dsn=dsn, options=options)

    @classmethod
    def import_snapshot(
        cls, dsn: str, token: str, options: ConnectionOptions | None = None
    ) -> SnapshotSession:
        """Opens a session that imports an exported snapshot.

        Args:
            dsn: The source database (the one that exported the snapshot).
            token: The server-issued ``pg_export_snapshot()`` token.
            options: Connection options.

        Raises:
            SessionError: ``source_unreachable`` or ``source_login_failed``.
            SnapshotError: ``snapshot_import_failed`` when the token is unknown, the exporting
                transaction has ended, or the database differs.
        """
        options = options or ConnectionOptions()
        conn = _read_only_session(dsn, options)
        try:
            evidence = set_transaction_snapshot(conn, token)
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
        except psycopg.Error as exc:
            conn.close()
            raise _import_failed(exc) from None
        except BaseException:
            conn.close()
            raise
        assert row is not None
        return cls(conn, evidence, _pid(row[0]), dsn=dsn, options=options)

    def worker(self) -> SnapshotSession:
        """Opens a new session that imports this session's exported snapshot.

        Raises:
            SnapshotError: ``snapshot_not_exported`` when this session did not export its
                snapshot; ``snapshot_import_failed`` as :meth:`import_snapshot`.
        """
        if not self.exported:
            raise SnapshotError(
                "snapshot_not_exported",
                "Worker sessions can only import an exported snapshot.",
                ["Open the coordinator with SnapshotSession.open(dsn, export=True)."],
            )
        return SnapshotSession.import_snapshot(self._dsn, self.evidence.token, self.options)

    def clock_timestamp(self) -> datetime:
        """The server's ``clock_timestamp()`` now (the clock receipts name)."""
        return server_clock(self.conn)

    def commit_and_close(self) -> None:
        """Ends the read-only transaction with COMMIT and closes the session."""
        self.transaction.commit_and_close()

    def rollback_and_close(self) -> None:
        """Ends the read-only transaction with ROLLBACK and closes the session."""
        self.transaction.rollback_and_close()

    def close(self) -> None:
        """Like :meth:`rollback_and_close`, but quiet: a session the server already lost is
        just closed (a read-only transaction has nothing to keep). Ends a ``with`` block, and
        lets resources that close what they track (``track(session)``) hold a snapshot open."""
        with contextlib.suppress(psycopg.Error):
            self.rollback_and_close()


def _read_only_session(dsn: str, options: ConnectionOptions) -> Connection:
    conn = connect(dsn, options, side="source")
    set_transaction_mode(conn, psycopg.IsolationLevel.REPEATABLE_READ, read_only=True)
    return conn


class LazySnapshot:
    """Opens one :class:`SnapshotSession` on first use and hands the same one to every caller.

    Lazy artifacts (batched COPY) acquire their window when they are first consumed, not when
    they are built; several of them share this opener so that they all read one snapshot.

    Args:
        opener: Opens the session, e.g. ``lambda: SnapshotSession.open(dsn)``.
    """

    def __init__(self, opener: Callable[[], SnapshotSession]) -> None:
        self._opener = opener
        self._lock = threading.Lock()
        self._session: SnapshotSession | None = None

    def get(self) -> SnapshotSession:
        """The session, opened now if this is the first call."""
        with self._lock:
            if self._session is None:
                self._session = self._opener()
            return self._session


def read_snapshot(conn: Connection, *, export: bool = False) -> tuple[SnapshotEvidence, int]:
    """Reads the snapshot evidence of ``conn``'s open ``REPEATABLE READ`` transaction.

    Run it as the transaction's first statement: the snapshot that statement runs under becomes
    the transaction's snapshot, and its token and the server time are read under it.

    Args:
        conn: A session inside a ``REPEATABLE READ`` (or ``SERIALIZABLE``) transaction.
        export: Export the snapshot with ``pg_export_snapshot()`` (workers can import it)
            instead of reading ``pg_current_snapshot()``.

    Returns:
        The evidence and the session's backend pid.
    """
    token = sql.SQL("pg_export_snapshot()" if export else "pg_current_snapshot()::text")
    row = conn.execute(
        sql.SQL("SELECT {}, clock_timestamp(), pg_backend_pid()").format(token)
    ).fetchone()
    assert row is not None
    evidence = SnapshotEvidence(
        authority=EXPORTED_SNAPSHOT if export else CURRENT_SNAPSHOT,
        token=str(row[0]),
        acquired_at=_timestamp(row[1]),
        clock_authority=POSTGRES_CLOCK,
    )
    return evidence, _pid(row[2])


def check_snapshot_token(token: str) -> str:
    """Checks that ``token`` has the shape of a ``pg_export_snapshot()`` token.

    The token still reaches SQL only through :class:`psycopg.sql.Literal`; this check turns a
    wrong value (a digest, a ``pg_current_snapshot()`` text, an empty string) into a clear
    error before any session is opened.

    Raises:
        SnapshotError: ``snapshot_token_invalid``.
    """
    if not isinstance(token, str) or not _TOKEN_SHAPE.fullmatch(token):
        raise SnapshotError(
            "snapshot_token_invalid",
            f"{token!r} is not an exported snapshot token (such as '00000003-0000001B-1').",
            [
                "Pass the token of a session opened with SnapshotSession.open(dsn, export=True) "
                "(its .token), not a digest or a pg_current_snapshot() value.",
            ],
        )
    return token


def set_transaction_snapshot(conn: Connection, token: str) -> SnapshotEvidence:
    """Imports an exported snapshot into ``conn``'s just-begun transaction.

    Call it as the first statement of a ``REPEATABLE READ`` transaction (read only or read
    write). PostgreSQL takes no bind parameter in ``SET TRANSACTION
    SNAPSHOT``: the token is composed with :class:`psycopg.sql.Literal`.

    Args:
        conn: A session whose next ``REPEATABLE READ`` transaction has not run a query yet.
        token: The ``pg_export_snapshot()`` token of a transaction still open.

    Returns:
        The evidence: authority ``EXPORTED_SNAPSHOT``, the token, the server time of the import.

    Raises:
        SnapshotError: ``snapshot_import_failed`` when the token is unknown or malformed, its
            exporting transaction has ended, or the database differs.
    """
    try:
        # PostgreSQL takes no parameter here: the server-issued token goes in as a literal.
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(token)))
        acquired_at = server_clock(conn)
    except psycopg.Error as exc:
        raise _import_failed(exc) from None
    return SnapshotEvidence(
        authority=EXPORTED_SNAPSHOT,
        token=token,
        acquired_at=acquired_at,
        clock_authority=POSTGRES_CLOCK,
    )


def _import_failed(exc: psycopg.Error) -> SnapshotError:
    return SnapshotError(
        "snapshot_import_failed",
        f"Could not import the exported snapshot: {redact(str(exc))}",
        [
            "Import while the exporting transaction is still open.",
            "Import into a session of the same database as the exporting one.",
        ],
    )


def server_clock(conn: Connection) -> datetime:
    """The server's ``clock_timestamp()`` now, read on ``conn``."""
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return _timestamp(row[0])


def _timestamp(value: object) -> datetime:
    assert isinstance(value, datetime)
    return value


def _pid(value: object) -> int:
    assert isinstance(value, int)
    return value
