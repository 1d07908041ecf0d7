"""The peak memory of one process alone, for the tests that bound a run's memory.

``getrusage(RUSAGE_SELF).ru_maxrss`` is not that: Linux carries the high-water mark of the
address space a process replaced by ``execve`` into it (``exec_mmap`` keeps the old mm's
``hiwater_rss`` in ``signal->maxrss``). A child that Python's ``subprocess`` starts (``vfork``,
then ``execve``) therefore reports at least its parent's peak: a test process that had grown to
250 MB (Dagster, other tests) made a 77 MB run read as 253 MB. ``VmHWM`` of
``/proc/self/status`` is the high-water mark of the process's own address space since its
``execve``: the memory of the run alone, Python and libpq's buffers included, the servers
(other processes) not.
"""

from __future__ import annotations

from pathlib import Path


def own_peak_mb() -> int:
    """This process's own peak resident set size since its ``execve`` (``VmHWM``), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("no VmHWM in /proc/self/status")
