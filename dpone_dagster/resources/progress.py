"""Mirroring committed backfill batches into Dagster, off the copy's path.

After every committed batch the UI gets an ``AssetObservation`` (checkpoint, rows copied, mark,
remaining estimate) and the run's ``dpone/partition``, ``dpone/checkpoint`` and ``dpone/copied``
tags. Writing them into the instance's storage costs the step tens of milliseconds per batch, a
fair share of a batch's own time. A reporter thread writes them while the next batch copies
(mostly while the copy waits for the servers): every batch still gets its observation, in order,
and the run's tags show the newest batch (a tag update that a newer one already replaced is
skipped). :meth:`ProgressReporter.flush` waits until everything reported is written, and
re-raises a failure of the thread; the step flushes before it yields anything else, so the
observations always precede the partition's materialization.
"""

import queue
import threading
from types import TracebackType

import dagster as dg

from dpone_dagster.backfill import BatchResult
from dpone_dagster.metadata import batch_observation

_Item = tuple[int, str, BatchResult]


class ProgressReporter:
    """Writes each committed batch's observation and the run's progress tags from a thread.

    Args:
        context: The step's context.
        key: The backfilled asset.
    """

    def __init__(self, context: dg.AssetExecutionContext, key: dg.AssetKey) -> None:
        self.context = context
        self.key = key
        self._queue: queue.Queue[_Item | None] = queue.Queue()
        self._reported = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="dpone-progress", daemon=True)
        self._thread.start()

    def __enter__(self) -> "ProgressReporter":
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._queue.put(None)
        self._thread.join()
        if exc is None:
            self._raise()

    def report(self, partition: str, batch: BatchResult) -> None:
        """Queues a committed batch for the UI."""
        self._raise()
        self._reported += 1
        self._queue.put((self._reported, partition, batch))

    def flush(self) -> None:
        """Waits until every reported batch is in Dagster.

        Raises:
            BaseException: what the reporter thread failed with.
        """
        self._queue.join()
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                if self._error is None:
                    self._write(*item)
            except BaseException as exc:  # re-raised in the step's thread
                self._error = exc
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def _write(self, number: int, partition: str, batch: BatchResult) -> None:
        self.context.log_event(batch_observation(self.key, partition, batch))
        if number != self._reported:  # a newer batch is queued: its tags replace these
            return
        progress = batch.run.progress
        self.context.instance.add_run_tags(
            self.context.run.run_id,
            {
                "dpone/partition": partition,
                "dpone/checkpoint": progress.checkpoint or "",
                "dpone/copied": str(progress.copied_count),
            },
        )
