"""The baseline every speed benchmark compares with: the raw binary ``psql | psql`` COPY pipe.

One reader and one writer backend, two ``psql`` clients between them:
``psql -c "COPY t TO STDOUT (FORMAT binary)" | psql -c "COPY t FROM STDIN (FORMAT binary)"``.
A benchmark runs it before and after each measured path and divides the pipe's time around a
path by the path's own (1.0 is as fast as the pipe). That ratio only means something while the
machine kept its speed, so beside each ratio the benchmarks print the pipe's absolute seconds
and its spread (:func:`spread`: (slowest - fastest) / median of the pipe runs the ratio rests
on), and print no ratio when the spread is over :data:`MAX_SPREAD` (:func:`ratio_cell`).

It also runs cold processes (:func:`cold_process`): a fresh interpreter timed from its start to
its exit, as a Dagster run worker pays it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from psycopg import conninfo

MAX_SPREAD = 0.15
"""The largest spread of the pipe runs under a ratio that the benchmarks print a ratio for."""


def psql_args(dsn: str) -> list[str]:
    """``psql`` with the DSN's host, port, user and database, quiet, stopping on an error."""
    params = conninfo.conninfo_to_dict(dsn)
    return [
        "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1",
        "-h", str(params.get("host") or "127.0.0.1"),
        "-p", str(params.get("port") or 5432),
        "-U", str(params.get("user") or "postgres"),
        "-d", str(params["dbname"]),
    ]  # fmt: skip


def psql_pipe(source: str, target: str, table: str) -> float:
    """Seconds for ``psql COPY table TO STDOUT binary | psql COPY table FROM STDIN binary``."""
    out = [*psql_args(source), "-c", f"COPY {table} TO STDOUT (FORMAT binary)"]
    inp = [*psql_args(target), "-c", f"COPY {table} FROM STDIN (FORMAT binary)"]
    started = time.perf_counter()
    producer = subprocess.Popen(out, stdout=subprocess.PIPE)
    consumer = subprocess.run(inp, stdin=producer.stdout, check=True)
    assert producer.stdout is not None
    producer.stdout.close()
    if producer.wait() != 0 or consumer.returncode != 0:
        raise RuntimeError("the raw psql pipe failed")
    return time.perf_counter() - started


def spread(seconds: Sequence[float]) -> float:
    """(slowest - fastest) / median of some pipe runs: 0.0 for one run."""
    return (max(seconds) - min(seconds)) / statistics.median(seconds)


def ratio_cell(ratio: float, pipes: Sequence[float], limit: float = MAX_SPREAD) -> str:
    """The ratio as printed (two decimals), or ``refused`` when the pipe runs it rests on
    spread over ``limit`` (the machine's speed changed under the measurement)."""
    return "refused" if spread(pipes) > limit else f"{ratio:.2f}"


def pipe_cells(pipes: Sequence[float]) -> tuple[str, str]:
    """The pipe's median seconds and its spread, as printed beside a ratio."""
    return f"{statistics.median(pipes):.2f}", f"{spread(pipes):.0%}"


def refusal(name: str, pipes: Sequence[float], limit: float = MAX_SPREAD) -> str | None:
    """Why ``name``'s ratio is not printed, or None when it is."""
    if spread(pipes) <= limit:
        return None
    return (
        f"{name}: no ratio: the raw pipe runs around it took {min(pipes):.2f} to "
        f"{max(pipes):.2f} s, a spread of {spread(pipes):.0%} (over {limit:.0%}): the machine's "
        "speed changed during the measurement; measure again on a quiet machine"
    )


def cold_process(argv: Sequence[str]) -> tuple[float, Any, float]:
    """Runs ``argv`` as a fresh process: (seconds from its start to its exit, the JSON of its
    last output line, its peak RSS in MB from ``wait4``).

    Raises:
        SystemExit: the process failed.
    """
    started = time.perf_counter()
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"{argv[1:3]} failed: {output}")
    return seconds, json.loads(output.strip().splitlines()[-1]), usage.ru_maxrss / 1024
