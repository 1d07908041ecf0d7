"""The stream's apply worker: commits the stream's target transactions in order, on a thread of
the process's pool (:func:`~dpone_dagster.postgres.threads.background`), while the stream reads and
stages the next one.

A target transaction's apply (its net effect by key, the merge, the ledger's applied position,
the commit; the slot's advance after it runs on a thread of its own, :mod:`.commits`) is the
target server's work: the thread mostly waits on the server, without the interpreter's lock,
while the stream's own thread stages the next source transactions on the other target
session. The worker runs one job at a time and holds at most one: submitting
the next waits for the one before, so target transactions commit in the stream's order, and the
session is never used by both threads at once (the stream touches it only after :meth:`wait`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import Future, wait

from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.threads import background

CANCEL_TIMEOUT = 10.0
"""Seconds the cancel of a job's statement in flight is given (:meth:`ApplyWorker.stop`)."""


class ApplyWorker:
    """Runs the stream's apply jobs on a background thread, one at a time, in order."""

    def __init__(self) -> None:
        self._job: Future[None] | None = None

    @property
    def busy(self) -> bool:
        """True while the job submitted last is still running."""
        return self._job is not None and not self._job.done()

    def submit(self, job: Callable[[], None]) -> None:
        """Runs ``job`` on the worker's thread once the job before it has ended (its failure
        is raised here, and ``job`` is not run)."""
        self.wait()
        self._job = background().submit(job)

    def wait(self) -> None:
        """Waits for the job in flight, if any; raises its failure."""
        job, self._job = self._job, None
        if job is not None:
            job.result()

    def stop(self, *conns: Connection) -> None:
        """On the stream's failure: cancels the job's statement in flight on ``conns`` (the
        sessions it may be using) and waits for the job to end. Its own failure (the cancel's,
        most often) is the job's to clean up, and never replaces the stream's."""
        job, self._job = self._job, None
        if job is not None:
            for conn in conns:
                if not job.done() and not conn.closed:
                    with contextlib.suppress(Exception):
                        conn.cancel_safe(timeout=CANCEL_TIMEOUT)
            with contextlib.suppress(BaseException):
                job.result()

    def close(self) -> None:
        """Waits for the job in flight, if any, leaving its failure to whoever waited before
        (the thread it ran on goes back to :func:`~dpone_dagster.postgres.threads.background`)."""
        job, self._job = self._job, None
        if job is not None:
            wait([job])
