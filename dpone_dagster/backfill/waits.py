"""Waiting on the server's own state with a deadline: a wait that runs out raises, never returns.

PostgreSQL has no call that blocks until another session's transaction or backend has ended
without taking part in it, so the backfill polls the server's view of it (``pg_locks``,
``pg_stat_activity``) and stops at a deadline with an error that names what was still running.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

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
