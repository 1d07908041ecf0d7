"""A process tree's time and peak memory, as ``bench/peers.py`` measures each tool.

A tool's process starts others (Sling's CLI, pgcopydb's workers, the pipe's two ``psql``), and
``wait4``'s ``ru_maxrss`` is neither their sum nor the child's own figure (Linux carries the
parent's high-water mark into a child across ``execve``: ``tests/helpers/memory.py``). So the
tree is read from ``/proc`` while it runs: each process's own peak (``VmHWM``, since its
``execve``), summed over the tree.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


def _descendants(root: int) -> list[int]:
    """``root`` and every process under it, from ``/proc/*/stat``."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def _hwm_kb(pid: int) -> int:
    """The process's own peak resident set (``VmHWM``), or 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def measured(argv: Sequence[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Runs ``argv``: (seconds from its start to its exit, the peak MB of its process tree, its
    output). The tree's peak is the sum of each process's own ``VmHWM``, sampled every 20 ms.

    Raises:
        RuntimeError: the process failed (its last output lines).
    """
    started = time.perf_counter()
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env, text=True)  # fmt: skip
    peaks: dict[int, int] = {}
    while proc.poll() is None:
        for pid in _descendants(proc.pid):
            peaks[pid] = max(peaks.get(pid, 0), _hwm_kb(pid))
        time.sleep(0.02)
    seconds = time.perf_counter() - started
    output = proc.stdout.read() if proc.stdout else ""
    if proc.returncode != 0:
        raise RuntimeError("\n".join(output.strip().splitlines()[-6:]))
    return seconds, sum(peaks.values()) / 1024, output
