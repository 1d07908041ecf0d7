"""The cursor engine: one job's tables, sessions and ledger, its batches committed through the one
protocol under a mark policy, its failures coded. No Dagster.

A :class:`CursorCopy` is what both faces are: :class:`~dpone_dagster.backfill.Backfill` with
the fixed mark (:class:`~.mark_policies.FixedMark`, its rows appended and its ranges reconciled)
and :class:`~dpone_dagster.incremental.IncrementalSync` with the moving mark
(:class:`~.mark_policies.MovingMark`, its rows merged and its deletes found). The engine holds
what does not depend on the policy:

- the job's tables, cursor and label, its two databases and the ledger's place;
- its sessions: opened at once (each start is a new server process's), in autocommit mode
  (every transaction begun by :func:`~dpone_dagster.core.sessions.transaction` with its
  isolation level and read-only mode; a policy whose target the load path drives opens that
  one without autocommit), kept until :meth:`CursorCopy.close` and closed on any failure or
  interrupt, so an interrupted step never leaves a transaction open;
- the one way a database failure becomes the job's stable error (:meth:`CursorCopy.guard`:
  ``<side>_permission_denied`` and the other kinds of the database-failure catalog, else the
  policy's outage code);
- a batch committed through :func:`~.batch_commit.commit_batch`, and the one answer to a lost
  COMMIT: new sessions once the old one has ended (:meth:`CursorCopy.after_lost_commit`), after
  which the ledger says whether the batch committed.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import ClassVar, Self, TypeVar

import psycopg

from dpone_dagster.core.errors import engine_error
from dpone_dagster.core.ledger import LedgerConfig
from dpone_dagster.core.sessions import Sessions, open_at_once, prepared_session
from dpone_dagster.lifecycle import DponeError, redact
from dpone_dagster.postgres.connection import Connection, ConnectionOptions, Side
from dpone_dagster.postgres.failures import database_error
from dpone_dagster.postgres.identifiers import TableName

from .batch_commit import PhaseHook, wait_for_lost_commit

T = TypeVar("T")


def _table(name: TableName | str) -> TableName:
    return name if isinstance(name, TableName) else TableName.parse(name)


class CursorCopy:
    """One cursor job: a source table copied in cursor order into a target table.

    A face sets its policy's class attributes (:attr:`outage`, :attr:`target_autocommit`,
    :attr:`prepared`) and its mark policy (``marks``).

    Args:
        source_dsn: The source database.
        target_dsn: The target database (and, by default, the ledger's).
        table: The source table (``TableName`` or text such as ``'sales."Order Items"'``).
        cursor: The cursor column's exact name.
        target_table: The target table; defaults to the source table's name.
        ledger: Where the ledger lives (default: schema ``dpone_ledger`` of the target).
        label: Distinguishes jobs whose databases and tables share names on other servers.
        connection_options: Session options (application name, timeouts), of both sides unless
            ``target_connection_options`` is given.
        target_connection_options: Options of the target's (and the ledger's) sessions.
        on_phase: Called with each batch's phases (``"copy"``... ``"commit"``,
            ``"committed"``).

    Raises:
        IdentifierError: ``identifier_invalid`` for a name PostgreSQL cannot hold exactly.
    """

    outage: ClassVar[str]
    """The policy's code of a database outage (``backfill_persistence_failed``,
    ``incremental_failed``)."""
    target_autocommit: ClassVar[bool] = True
    """Open the target's session in autocommit mode (``False``: the load path drives it)."""
    prepared: ClassVar[bool] = False
    """Prepare every statement from its first execution (a job that runs the same ledger and
    range statements batch after batch: its first checkpoints cost what the thousandth does;
    psycopg sends its own ``BEGIN``, ``COMMIT`` and savepoints as plain statements)."""

    def __init__(
        self,
        source_dsn: str,
        target_dsn: str,
        table: TableName | str,
        *,
        cursor: str,
        target_table: TableName | str | None,
        ledger: LedgerConfig,
        label: str,
        connection_options: ConnectionOptions | None,
        target_connection_options: ConnectionOptions | None,
        on_phase: PhaseHook | None,
    ) -> None:
        self.source = _table(table)
        self.target = _table(target_table) if target_table is not None else self.source
        self.cursor = cursor
        self.source_dsn, self.target_dsn = source_dsn, target_dsn
        self.ledger_config = ledger
        self.label = label
        self.connection_options = connection_options
        self.target_connection_options = target_connection_options or connection_options
        self.on_phase: PhaseHook = on_phase or (lambda _: None)
        self._sessions: Sessions | None = None

    # -- sessions ---------------------------------------------------------------------------

    def _connect(self, dsn: str, side: Side) -> Connection:
        options = self.connection_options if side == "source" else self.target_connection_options
        autocommit = side != "target" or self.target_autocommit
        conn = prepared_session(dsn, options, side, autocommit=autocommit)
        if self.prepared:
            conn.prepare_threshold = 0
        return conn

    def open(self) -> Sessions:
        """The job's sessions, opened at once on first use and kept until :meth:`close` (the
        ledger's is the target's unless the ledger lives elsewhere); the ledger is created or
        migrated on a new ledger session."""
        if self._sessions is None:
            openers = [partial(self._connect, self.source_dsn, "source"),
                       partial(self._connect, self.target_dsn, "target")]  # fmt: skip
            elsewhere = self.ledger_config.dsn
            if elsewhere is not None:
                openers.append(partial(self._connect, elsewhere, "ledger"))
            opened = open_at_once(*openers)
            sessions = Sessions(opened[0], opened[1], opened[-1])
            try:
                self.ensure_ledger(sessions.ledger)
            except BaseException:
                sessions.close()
                raise
            self._sessions = sessions
        return self._sessions

    def ensure_ledger(self, conn: Connection) -> None:
        """Creates or migrates the ledger on a new ledger session (a face's own step; nothing by
        default)."""

    def close(self) -> None:
        """Closes every session (any open transaction is rolled back by the server)."""
        sessions, self._sessions = self._sessions, None
        if sessions is not None:
            sessions.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- failures ---------------------------------------------------------------------------

    def guard(self, step: Callable[[Sessions], T]) -> T:
        """Runs ``step`` on the open sessions; a database failure closes them and is raised as
        its stable error (:meth:`database_failure`), any other failure closes them too."""
        sessions: Sessions | None = None
        try:
            sessions = self.open()
            return step(sessions)
        except psycopg.Error as exc:
            error = self.database_failure(exc, sessions)
            self.close()
            raise error from exc
        except BaseException:
            self.close()
            raise

    def database_failure(self, exc: psycopg.Error, sessions: Sessions | None) -> DponeError:
        """The stable error of a database failure: ``<side>_permission_denied`` and the other
        kinds of the database-failure catalog, else the policy's :attr:`outage` (read before
        the sessions are abandoned)."""
        outage = engine_error(self.outage, redact(str(exc)).strip())
        if sessions is None:  # opening them failed: the target's (or the ledger's) set-up
            return database_error(exc, "target", outage=outage, known=[self.target])
        return sessions.database_failure(exc, outage, sources=[self.source], targets=[self.target])

    def after_lost_commit(self, pid: int) -> Sessions:
        """New sessions once the ledger session whose COMMIT answer was lost (backend ``pid``)
        has ended: the ledger then says whether the batch committed
        (:mod:`dpone_dagster.cursor.batch_commit`).

        Raises:
            EngineError: the policy's :attr:`outage` code when that backend outlives the wait.
        """
        self.close()
        sessions = self.open()
        conn = sessions.ledger
        manual = not conn.autocommit
        try:
            # Each look at pg_stat_activity in a transaction of its own: within one, the
            # server's view of the backends stays as it first read it.
            conn.autocommit = True
            wait_for_lost_commit(conn, pid, code=self.outage)
            conn.autocommit = not manual
        except BaseException:
            self.close()
            raise
        return sessions
