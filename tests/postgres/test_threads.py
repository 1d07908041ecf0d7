"""The one pool of threads (:mod:`dpone_dagster.postgres.threads`): a forked child, whose copy
of the pool has no threads, runs its steps on a pool of its own instead of waiting forever."""

from __future__ import annotations

import os
import signal

from dpone_dagster.postgres.threads import at_once, background


def test_a_forked_child_runs_its_steps_on_a_pool_of_its_own() -> None:
    # The parent's pool has an idle thread: a copy of it in a child would take that thread
    # (gone with the fork) for the step, and the step would never run.
    assert at_once(lambda: 1, lambda: 2) == (1, 2)
    parent_pool = background()
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if the step ran on another pool, within 10 s
        signal.alarm(10)
        ok = False
        try:
            ok = at_once(lambda: 3, lambda: 4) == (3, 4) and background() is not parent_pool
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), f"the child's step never ran (killed by signal {status})"
    assert os.WEXITSTATUS(status) == 0
