"""Mirroring committed backfill batches into Dagster, off the copy's path.

After every committed batch the UI gets an ``AssetObservation`` (checkpoint, rows copied, mark,
remaining estimate) and the run's tags: ``dpone/partition`` (the one copying),
``dpone/partitions_done`` (``3 of 31``), ``dpone/copied`` (rows of every partition of the run) and
``dpone/checkpoint`` (short). Writing them into the instance's storage costs the step tens of
milliseconds per batch, a fair share of a batch's own time. A reporter thread writes them while the
next batch copies (mostly while the copy waits for the servers): every batch still gets its
observation, in order, and the run's tags follow the newest batch at most every :data:`TAGS_EVERY`
seconds (a run-tag update rewrites the run's record, and the UI polls no faster).
:meth:`ProgressReporter.flush` waits until everything reported is written, brings the tags up to the
last batch and re-raises a failure of the thread; the step flushes at the end of every partition,
before it yields anything else, so the observations always precede the partition's materialization.
"""

import queue
import threading
import time
from types import TracebackType

import dagster as dg

from dpone_dagster.backfill import BatchResult
from dpone_dagster.dagster.metadata.backfill import batch_observation
from dpone_dagster.dagster.metadata.parts import short_digest
from dpone_dagster.dagster.metadata.tags import DponeRunTags

_Item = tuple[str, BatchResult]

TAGS_EVERY = 2.0
"""Seconds between two updates of the run's progress tags while a partition runs."""


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
        self._untagged: _Item | None = None  # the newest batch the run's tags do not show yet
        self._tagged_at = 0.0
        self._error: BaseException | None = None
        self._total = 0  # partitions of the run
        self._done = 0  # partitions of the run done
        self._copied_before = 0  # rows the partitions done copied
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

    def begin(self, partitions: int) -> None:
        """The run copies ``partitions`` partitions: the tags count them done of how many."""
        self._total = partitions

    def partition_done(self, copied: int) -> None:
        """A partition of the run is done (flushed) having copied ``copied`` rows."""
        self._done += 1
        self._copied_before += copied
        self.context.instance.add_run_tags(
            self.context.run.run_id,
            dict(
                DponeRunTags(
                    partitions_done=f"{self._done} of {self._total}",
                    copied=str(self._copied_before),
                )
            ),
        )

    def report(self, partition: str, batch: BatchResult) -> None:
        """Queues a committed batch for the UI."""
        self._raise()
        self._queue.put((partition, batch))

    def flush(self) -> None:
        """Waits until every reported batch is in Dagster.

        Raises:
            BaseException: what the reporter thread failed with.
        """
        self._queue.join()
        self._raise()
        if self._untagged is not None:
            self._tag(*self._untagged)

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

    def _write(self, partition: str, batch: BatchResult) -> None:
        self.context.log_event(batch_observation(self.key, partition, batch))
        self._untagged = (partition, batch)
        if time.monotonic() - self._tagged_at >= TAGS_EVERY:
            self._tag(partition, batch)

    def _tag(self, partition: str, batch: BatchResult) -> None:
        self._untagged, self._tagged_at = None, time.monotonic()
        progress = batch.run.progress
        tags = DponeRunTags(
            partition=partition,
            partitions_done=f"{self._done} of {self._total}",
            checkpoint=short_digest(progress.checkpoint) if progress.checkpoint else None,
            copied=str(self._copied_before + progress.copied_count),
        )
        self.context.instance.add_run_tags(self.context.run.run_id, dict(tags))
