"""The threads the engines run a step beside another on: one pool per process, its threads kept.

A run does a handful of short steps at once: it opens its sessions together, reads the source's
and the target's catalogs together, advances the slot while it syncs the sequences. Each used to
start a thread of its own and end it; on a busy 2-core machine a thread's start waits for the
scheduler, and those starts were a tenth of a small replication run. The steps now run on
:func:`background`, a pool whose idle threads wait for the next step (a new thread is started
only when none is idle, so a step never waits for another to end).

The pool is made at first use, and made again in a child process (a fork copies the pool but not
its threads). Its idle threads end when the interpreter exits.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

_T = TypeVar("_T")
_U = TypeVar("_U")

MAX_THREADS = 64
"""Threads the pool starts at most: far more steps than a process runs at once (each run uses a
few), so a step that waits for another step never waits for a thread."""

_lock = threading.Lock()
_pool: tuple[int, ThreadPoolExecutor] | None = None


def background() -> ThreadPoolExecutor:
    """The process's pool (see the module): submit a step, and wait for its future on every
    path out (the pool is shared, so leaving a block does not wait for it)."""
    global _pool
    with _lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="dpone"))
        return _pool[1]


def at_once(first: Callable[[], _T], second: Callable[[], _U]) -> tuple[_T, _U]:
    """The results of ``first`` and ``second``, run at the same time: ``second`` on a
    :func:`background` thread, ``first`` on the calling one (each with a session of its own,
    so both servers work at once). Both have ended when it returns or raises; ``first``'s
    failure is the one raised, else ``second``'s.
    """
    other = background().submit(second)
    try:
        mine = first()
    except BaseException:
        wait([other])
        raise
    return mine, other.result()
