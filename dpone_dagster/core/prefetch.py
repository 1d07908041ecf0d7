"""Reading ahead on a thread of its own: one side of a comparison computes while the other does.

A check that compares two servers chunk by chunk waits on each in turn; :func:`prefetched` runs
one side's reads on a background thread, a few items ahead, so both servers work at once (the
threads wait on the network, without the interpreter's lock). The reading side's session is
the thread's alone until the iterator ends.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import wait
from dataclasses import dataclass
from typing import Generic, TypeVar

from dpone_dagster.postgres.threads import background

_T = TypeVar("_T")


@dataclass(frozen=True)
class _Failed:
    error: BaseException


_END = object()


@dataclass
class _Reader(Generic[_T]):
    """The background thread's side: reads ``items()`` into ``box`` until told to stop."""

    items: Callable[[], Iterator[_T]]
    box: queue.Queue[object]
    stop: threading.Event

    def run(self) -> None:
        try:
            for item in self.items():
                if self.stop.is_set():
                    return
                self.box.put(item)
        except BaseException as exc:  # handed to the consumer, raised there
            self.box.put(_Failed(exc))
            return
        self.box.put(_END)


def prefetched(items: Callable[[], Iterator[_T]], *, ahead: int) -> Iterator[_T]:
    """The items of ``items()``, read on a background thread at most ``ahead`` items ahead of
    the consumer.

    Args:
        items: Opens the iterator (called on the background thread).
        ahead: Items read ahead at most.

    Yields:
        The items, in order.

    Raises:
        BaseException: whatever ``items()`` raised, where it raised it.
    """
    reader = _Reader(items, queue.Queue(ahead), threading.Event())
    reading = background().submit(reader.run)
    try:
        while (item := reader.box.get()) is not _END:
            if isinstance(item, _Failed):
                raise item.error
            yield item  # type: ignore[misc]
    finally:
        reader.stop.set()
        while not reading.done():  # a reader blocked on a full box is let through
            try:
                reader.box.get_nowait()
            except queue.Empty:
                wait([reading], timeout=0.01)
