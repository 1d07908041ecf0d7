"""The crash harness every engine's crash tests share: start a run in a child process
(:mod:`tests.helpers.crash_child`) and ``kill -9`` it at a chosen moment."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def start_child(engine: str, source: str, target: str, batch: int) -> subprocess.Popen[str]:
    """Starts one run of ``engine`` (a key of ``crash_child.ENGINES``) in its own process."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.crash_child", engine, source, target, str(batch)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def kill_at(
    proc: subprocess.Popen[str],
    mode: str,
    nth: int,
    rng: random.Random,
    *,
    timer: float = 0.2,
    inside_copy: float = 0.01,
) -> str:
    """Reads the child's lines and ``kill -9``s it at the ``nth`` line starting with ``mode``.

    Args:
        proc: The child (:func:`start_child`).
        mode: A phase (``copy``, ``apply``, ``commit``, ``committed``), or ``timer``: a random
            moment of up to ``timer`` seconds after the first ``copy``.
        nth: Which of the ``mode`` lines.
        rng: The test's seeded random source.
        timer: The longest ``timer`` wait, in seconds.
        inside_copy: After a ``copy`` (or a joining table's ``joining``) line, wait up to
            this long first (inside the COPY).

    Returns:
        ``"killed"``, ``"finished"`` (the run ended first) or ``"exit N"``.
    """
    assert proc.stdout is not None
    seen = 0
    for line in proc.stdout:
        if line.startswith("done"):
            proc.wait(30)
            return "finished"
        if mode == "timer" and line.startswith("copy"):
            time.sleep(rng.uniform(0.0, timer))
            break
        if line.startswith(mode):
            seen += 1
            if seen == nth:
                if mode in ("copy", "joining"):
                    time.sleep(rng.uniform(0.0, inside_copy))
                break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    return "killed" if proc.returncode == -signal.SIGKILL else f"exit {proc.returncode}"
