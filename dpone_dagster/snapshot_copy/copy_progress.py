"""Progress of a copy, reported to a caller's callback (a Dagster log, a progress bar)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from dpone_dagster.postgres.identifiers import TableName

Phase = Literal["extract", "load"]


@dataclass(frozen=True)
class CopyProgress:
    """How far one table's copy has come.

    Attributes:
        table: The source table.
        phase: ``extract`` while reading the source into a file, ``load`` while writing the
            target (a relay does both at once and reports ``load``).
        bytes: Bytes moved so far in this phase.
    """

    table: TableName
    phase: Phase
    bytes: int


ProgressCallback = Callable[[CopyProgress], None]


class ProgressMeter:
    """Counts bytes and calls ``callback`` each time another ``every`` bytes have moved.

    Called with each COPY block's size (the ``on_block`` hook of
    :func:`~dpone_dagster.postgres.copy.relay`), from one thread or several.

    Args:
        callback: Receives the progress.
        table: The table being copied.
        phase: The phase being measured.
        every: Bytes between two calls.
    """

    def __init__(
        self, callback: ProgressCallback, table: TableName, phase: Phase, every: int
    ) -> None:
        self.callback = callback
        self.table = table
        self.phase = phase
        self.every = max(1, every)
        self.bytes = 0
        self._next = self.every
        self._lock = threading.Lock()

    def __call__(self, nbytes: int) -> None:
        with self._lock:  # partitioned workers share a table's meter
            self.bytes += nbytes
            if self.bytes < self._next:
                return
            self._next = self.bytes + self.every
            progress = CopyProgress(self.table, self.phase, self.bytes)
        self.callback(progress)


def progress_hook(
    callback: ProgressCallback | None, table: TableName, phase: Phase, every: int
) -> ProgressMeter | None:
    """A :class:`ProgressMeter`, or None when nobody listens (the relay then skips the call)."""
    return None if callback is None else ProgressMeter(callback, table, phase, every)
