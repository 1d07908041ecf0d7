"""Strong locks on tables users read, taken politely: short attempts, backoff, a deadline.

A statement that needs an ``ACCESS EXCLUSIVE`` lock on a table others read (the ``replace``
swap's ``DROP TABLE`` and ``RENAME``, schema evolution's ``ALTER TABLE``, the stream's
soft-delete column) queues behind every session that holds any lock on the table, and from
then on every new reader queues behind *it*: one reader idle in transaction stalls them all.
:func:`under_lock_wait` runs such statements under a short ``lock_timeout``
(:data:`LOCK_ATTEMPT_SECONDS`), inside a savepoint, so a reader never queues behind them for
longer than one attempt. An attempt that times out is undone by the savepoint (the rest of the
load's transaction is kept: its staging tables and rows), the readers go through, and the next
attempt comes after an exponential backoff with jitter, until the session's ``lock_wait``
deadline (:attr:`~.connection.ConnectionOptions.lock_wait`, default
:data:`DEFAULT_LOCK_WAIT` seconds). There it raises ``target_lock_timeout``, naming the sessions
that held the lock (pid, application, state, for how long); the load's transaction then rolls
back, so the target is as it was and the staging tables are gone.

A retry is sound because the savepoint holds nothing but the retried statements: a statement
that fails leaves no effect behind, and ``lock_timeout`` is set with ``set_config(...,
true)`` inside the savepoint and reset to the session's own value before it is released, so no
later statement of the transaction (a ledger's advisory lock) runs under it.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

import psycopg

from .connection import LOCK_WAIT_SETTING, Connection
from .failures import DATABASE_ERRORS, DatabaseError
from .identifiers import TableName

R = TypeVar("R")

DEFAULT_LOCK_WAIT: Final = 300.0
"""Seconds a strong lock is waited for, in attempts, before ``target_lock_timeout``."""
LOCK_ATTEMPT_SECONDS: Final = 1.0
"""One attempt's ``lock_timeout``: the longest a new reader of the table queues behind it."""
BACKOFF_FIRST: Final = 0.05
"""Seconds before the second attempt (then doubled each time, with jitter)."""
BACKOFF_MAX: Final = 5.0
"""The longest pause between two attempts."""

_HOLDERS = """
SELECT l.pid, coalesce(a.application_name, ''), coalesce(a.state, ''), l.mode,
       extract(epoch FROM now() - coalesce(a.xact_start, a.query_start, a.backend_start))::float8
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.database = (SELECT oid FROM pg_database
                                                WHERE datname = current_database())
  AND l.relation = ANY(%s::regclass[]) AND l.pid <> pg_backend_pid()
ORDER BY 5 DESC NULLS LAST, l.pid
"""


@dataclass(frozen=True)
class Blocker:
    """A session that held (or waited ahead for) a lock on the table when the wait ended.

    Attributes:
        pid: Its backend pid (``pg_terminate_backend(pid)`` ends it).
        application_name: Its ``application_name``.
        state: ``active``, ``idle in transaction``...; empty when the role may not see it
            (another role's session, without ``pg_read_all_stats``).
        mode: The lock it holds, e.g. ``AccessShareLock``.
        seconds: How long its transaction has been open; None when not visible.
    """

    pid: int
    application_name: str
    state: str
    mode: str
    seconds: float | None

    def describe(self) -> str:
        """``pid 4242 (application 'psql', idle in transaction for 42s, AccessShareLock)``."""
        state = self.state or "state not visible to this role"
        held = "" if self.seconds is None else f" for {self.seconds:.0f}s"
        return f"pid {self.pid} (application {self.application_name!r}, {state}{held}, {self.mode})"


class LockTimeoutError(DatabaseError):
    """``target_lock_timeout``: the lock was not granted before the ``lock_wait`` deadline.

    Attributes:
        blockers: The sessions that held a lock on the table at the deadline.
    """

    blockers: tuple[Blocker, ...] = ()


def lock_wait_of(conn: Connection) -> float:
    """The session's ``lock_wait`` deadline in seconds, as :func:`~.connection.connect` set it
    in the session's startup ``options`` (read from the connection's parameters: no round
    trip); :data:`DEFAULT_LOCK_WAIT` for a session opened otherwise."""
    options = conn.info.get_parameters().get("options", "")
    found = re.findall(rf"(?:-c\s*|--){re.escape(LOCK_WAIT_SETTING)}=(\S+)", options)
    return float(found[-1]) if found else DEFAULT_LOCK_WAIT  # the last one wins, as the server does


def under_lock_wait(
    conn: Connection, tables: Sequence[TableName], body: Callable[[], R], *, doing: str
) -> R:
    """Runs ``body`` (statements that lock ``tables`` ``ACCESS EXCLUSIVE``) in attempts of
    :data:`LOCK_ATTEMPT_SECONDS`, each in a savepoint of ``conn``'s transaction, until one is
    granted or the session's ``lock_wait`` runs out.

    Args:
        conn: The target session, inside its transaction.
        tables: The existing tables ``body`` locks (named, with their holders, at the deadline).
        body: The statements; run again after a timed-out attempt, so it must do nothing but
            run statements on ``conn`` (the savepoint undoes them).
        doing: What the statements do, for the message (``swap in the new rows``).

    Returns:
        What ``body`` returned.

    Raises:
        LockTimeoutError: ``target_lock_timeout`` at the deadline, naming the sessions holding
            locks on ``tables``; the transaction is still usable (the caller rolls it back).
    """
    deadline = time.monotonic() + lock_wait_of(conn)
    row = conn.execute("SELECT current_setting('lock_timeout')").fetchone()
    previous = str(row[0]) if row is not None else "0"
    attempts = 0
    while True:
        remaining = deadline - time.monotonic()
        attempt = max(0.001, min(LOCK_ATTEMPT_SECONDS, remaining))
        attempts += 1
        try:
            with conn.transaction():  # a savepoint: a timed-out attempt undoes only itself
                _set_lock_timeout(conn, f"{int(attempt * 1000)}ms")
                result = body()
                _set_lock_timeout(conn, previous)
                return result
        except psycopg.errors.LockNotAvailable:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _timed_out(conn, tables, doing, attempts) from None
        time.sleep(min(remaining, _backoff(attempts)))


def _set_lock_timeout(conn: Connection, value: str) -> None:
    # SET LOCAL as a function, so the value is a parameter: it ends with the transaction.
    conn.execute("SELECT set_config('lock_timeout', %s, true)", (value,))


def _backoff(attempts: int) -> float:
    """The pause after ``attempts`` failed attempts: doubling, capped, with full jitter on its
    upper half (two copies waiting for one table do not retry in step)."""
    ceiling = min(BACKOFF_MAX, BACKOFF_FIRST * float(2 ** min(attempts - 1, 16)))
    return ceiling * random.uniform(0.5, 1.0)


def blockers_of(conn: Connection, tables: Sequence[TableName]) -> list[Blocker]:
    """The other sessions holding (or awaiting) any lock on ``tables``, longest-open first."""
    rows = conn.execute(_HOLDERS, ([t.qualified for t in tables],)).fetchall()
    return [
        Blocker(int(r[0]), str(r[1]), str(r[2]), str(r[3]), None if r[4] is None else float(r[4]))
        for r in rows
    ]


def _timed_out(
    conn: Connection, tables: Sequence[TableName], doing: str, attempts: int
) -> LockTimeoutError:
    blockers = blockers_of(conn, tables)
    named = "; ".join(b.describe() for b in blockers) or "none left by now"
    wait = lock_wait_of(conn)
    names = ", ".join(t.qualified for t in tables)
    error = LockTimeoutError.from_catalog(
        DATABASE_ERRORS,
        "target_lock_timeout",
        f"It waited {wait:g}s (lock_wait, {attempts} attempts of at most "
        f"{LOCK_ATTEMPT_SECONDS:g}s) for an ACCESS EXCLUSIVE lock on {names} to {doing}. "
        f"Sessions holding a lock on it: {named}. The target was left unchanged and the staging "
        "tables are dropped with the load's transaction.",
    )
    error.blockers = tuple(blockers)
    return error
