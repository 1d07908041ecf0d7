"""The cursor engine's one batch-commit protocol, for both policies.

A batch of either policy commits its rows, its receipt and its job's advanced document in ONE
transaction of the ledger's session, in this order (:func:`commit_batch`):

1. the job's advisory lock is taken and its durable document read (:class:`~.cursor_ledger.
   CursorLedger`); the policy admits the batch against it, or answers without writing (a
   receipt already stored for the same request: a lost response, replayed; a run another
   process ended);
2. the policy lands the rows under a source snapshot of their own and derives the advanced
   document and the receipt from what landed. How rows land is the policy's value, its
   landing (``admit`` and ``land``): the fixed mark's
   :class:`~dpone_dagster.backfill.copier.AppendBatch` (a direct COPY, staged when rows exist;
   its ranges reconciled at the end), the moving mark's
   :class:`~dpone_dagster.incremental.batch.MergeBatch` (the load path's merge, then its
   deletes and check);
3. the receipt and the document are written by compare-and-swap (a concurrent writer's
   revision fails the swap with the policy's stale code);
4. COMMIT (with the ledger in another database, the rows commit first in the target's own
   transaction, then the receipt). Any failure before it rolls back every open transaction
   (:meth:`Sessions.abandon`): the durable checkpoint stays where it was and the next attempt
   reads from it.

A COMMIT whose answer never arrives (the socket dropped after the server received it) is raised
as :class:`LostCommitError`, naming the ledger session's backend. The batch may or may not have
committed; :func:`wait_for_lost_commit` waits until that backend has ended (its transaction is
then over one way or the other), after which the ledger says which: each engine reads its
receipt (the fixed mark answers the request by replay; the moving mark continues its run from
the durable state, which holds the batch or does not).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

import psycopg
from psycopg import IsolationLevel

from dpone_dagster.core.errors import EngineError, engine_error
from dpone_dagster.core.sessions import Sessions, transaction
from dpone_dagster.core.waits import wait_for_backend_exit
from dpone_dagster.postgres.connection import Connection, set_transaction_mode

from .cursor_ledger import CursorLedger, D, R

A = TypeVar("A")
L = TypeVar("L")
PhaseHook = Callable[[str], None]
"""Called with a batch's phases (``"copy"``... ``"commit"``, ``"committed"``): the one type of
both policies' ``on_phase``."""


class LostCommitError(Exception):
    """The ledger session's COMMIT was sent and its answer lost: the batch may have committed.

    Attributes:
        pid: The server backend of the session whose COMMIT it was.
    """

    def __init__(self, pid: int) -> None:
        super().__init__(f"The COMMIT of server backend {pid} was sent; its answer was lost.")
        self.pid = pid


@dataclass(frozen=True)
class Landed(Generic[D, R]):
    """What a landed batch writes to the ledger: the advanced document and its receipt."""

    after: D
    receipt: R


@dataclass(frozen=True)
class Committed(Generic[D, R, L]):
    """A committed batch: the documents before and after it, its receipt, and what its landing
    reports besides (the policy's own outcome)."""

    before: D
    after: D
    receipt: R
    landing: L


@dataclass(frozen=True)
class Answered(Generic[A]):
    """A batch the policy answered without writing anything (a replay, a run already over)."""

    answer: A


Admit = Callable[[Connection, D | None], "D | Answered[A]"]
"""Under the job's lock: the durable document the batch builds on, or an answer."""
Land = Callable[[D], "tuple[Landed[D, R], L]"]
"""Lands the batch's rows on top of the durable document; what the ledger then records."""


@contextmanager
def _ledger_transaction(conn: Connection) -> Iterator[None]:
    """The batch's transaction on the ledger's session, committed when the block ends (an
    autocommit session through :func:`~dpone_dagster.core.sessions.transaction`; a session
    without autocommit, the load path's, by an explicit COMMIT). A lost answer to that COMMIT
    is a :class:`LostCommitError`."""
    pid = conn.info.backend_pid
    if conn.autocommit:
        committing = False
        try:
            with transaction(conn, IsolationLevel.READ_COMMITTED, read_only=False):
                yield
                committing = True
        except psycopg.Error as exc:
            if committing and (conn.broken or conn.closed):
                raise LostCommitError(pid) from exc
            raise
        return
    set_transaction_mode(conn, IsolationLevel.READ_COMMITTED, read_only=False)
    yield
    try:
        conn.commit()
    except psycopg.Error as exc:
        if conn.broken or conn.closed:
            raise LostCommitError(pid) from exc
        raise


@contextmanager
def _rows_transaction(sessions: Sessions, on_phase: PhaseHook) -> Iterator[None]:
    """The transaction the batch's rows are written in.

    With the ledger in the target it is the ledger's own (already open): rows and receipt commit
    together. With the ledger elsewhere the target gets a transaction of its own, committed when
    the block ends, before the receipt is written: a crash between the two leaves rows without a
    receipt, which the next attempt finds present and equal (the fixed mark's replay through its
    staged apply).
    """
    if sessions.ledger_in_target:
        yield
        return
    with transaction(sessions.target, IsolationLevel.READ_COMMITTED, read_only=False):
        yield
        on_phase("commit")


def commit_batch(
    sessions: Sessions,
    ledger: CursorLedger[D, R],
    key: str,
    admit: Admit[D, A],
    land: Land[D, R, L],
    *,
    on_phase: PhaseHook = lambda _: None,
) -> Committed[D, R, L] | Answered[A]:
    """Runs one batch of job ``key`` through the protocol (the module's steps 1 to 4).

    Args:
        sessions: The run's sessions; the batch's transaction is the ledger's.
        ledger: The policy's binding of the ledger.
        key: The job's id (the run's, the stream's).
        admit: Under the lock, with the durable document (``None``: none stored): the document
            the batch builds on, or an :class:`Answered` that ends the batch without writing.
        land: Lands the rows (in the ledger's transaction, or committed first in the target's
            own when the ledger is elsewhere) and derives what the ledger records.
        on_phase: Called with ``"commit"`` just before the batch's first COMMIT (the rows'
            and the receipt's; the rows' alone when the ledger is elsewhere) and
            ``"committed"`` once the receipt committed.

    Raises:
        LostCommitError: The COMMIT's answer was lost (see :func:`wait_for_lost_commit`).
        EngineError: The policy's refusals and the ledger's stale swap; nothing was committed.
        psycopg.Error: A session failed; nothing of the batch was committed.
    """
    lc = sessions.ledger
    try:
        with _ledger_transaction(lc):
            ledger.lock(lc, key)
            admitted = admit(lc, ledger.fetch(lc, key))
            if isinstance(admitted, Answered):
                return admitted
            with _rows_transaction(sessions, on_phase):
                landed, landing = land(admitted)
            ledger.record(lc, admitted, landed.after, landed.receipt)
            if sessions.ledger_in_target:
                on_phase("commit")
    except BaseException as exc:
        sessions.abandon(exc)
        raise
    on_phase("committed")
    return Committed(admitted, landed.after, landed.receipt, landing)


def wait_for_lost_commit(
    conn: Connection, pid: int, code: str = "backfill_persistence_failed", timeout: float = 30.0
) -> None:
    """Waits until the ledger session whose COMMIT answer was lost (backend ``pid``) is gone:
    only then does the ledger say whether its batch committed.

    Args:
        conn: A new session on the ledger's server.
        pid: The backend of :class:`LostCommitError`.
        code: The policy's code when the backend outlives the wait.
        timeout: Seconds to wait.

    Raises:
        EngineError: ``code`` naming the backend when it is still there after ``timeout``.
    """

    def unknown(pid: int, timeout: float) -> EngineError:
        return engine_error(
            code,
            f"The ledger session whose COMMIT response was lost (server backend {pid}) was "
            f"still running after {timeout:g}s, so whether its batch committed is not known yet.",
            [
                f"Wait for backend {pid} to end (or end it with pg_terminate_backend({pid})), "
                "then run again: a batch whose receipt committed is not copied again, any "
                "other is.",
            ],
        )

    wait_for_backend_exit(conn, pid, timeout=timeout, timed_out=unknown)
