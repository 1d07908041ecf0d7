"""Waiting on the server's own state with a deadline: a wait that runs out raises, never returns.

PostgreSQL has no call that blocks until another session's transaction or backend has ended
without taking part in it, so the engines poll the server's view of it (``pg_locks``,
``pg_stat_activity``) and stop at a deadline with an error that names what was still running.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from dpone_dagster.postgres.connection import Connection

_Row = TypeVar("_Row")


def wait_while(
    poll: Callable[[], Sequence[_Row]],
    *,
    timeout: float,
    interval: float,
    timed_out: Callable[[Sequence[_Row]], Exception],
) -> float:
    """Calls ``poll`` until it answers nothing, at most ``timeout`` seconds.

    Args:
        poll: Reads what is still being waited for (one query on the server).
        timeout: Seconds before giving up.
        interval: Seconds between two polls.
        timed_out: Builds the error from ``poll``'s last answer.

    Returns:
        The seconds waited.

    Raises:
        Exception: ``timed_out(last answer)`` when ``poll`` still answers after ``timeout``.
    """
    started = time.monotonic()
    while pending := poll():
        if time.monotonic() - started >= timeout:
            raise timed_out(pending)
        time.sleep(interval)
    return time.monotonic() - started


def wait_for_backend_exit(
    conn: Connection,
    pid: int,
    *,
    timed_out: Callable[[int, float], Exception],
    timeout: float = 30.0,
    interval: float = 0.02,
) -> None:
    """Waits until server backend ``pid`` is gone (its transaction has committed or aborted).

    Used after a lost COMMIT response: until the old session has ended, the ledger cannot yet
    tell whether what it committed is there.

    Args:
        conn: A session on the same server.
        pid: The backend of the session whose COMMIT response was lost.
        timed_out: Builds the error from the pid and the timeout.
        timeout: Seconds to wait.
        interval: Seconds between two looks at ``pg_stat_activity``.

    Raises:
        Exception: ``timed_out(pid, timeout)`` when the backend is still there after ``timeout``.
    """

    def running() -> list[tuple[object, ...]]:
        return conn.execute("SELECT pid FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchall()

    wait_while(
        running, timeout=timeout, interval=interval, timed_out=lambda _: timed_out(pid, timeout)
    )
