"""A benchmark's result table as JSON (``--json bench/results/NAME.json``) and its machine.

``docs/benchmarks.py`` renders docs/benchmarks.md's figures from these files, so the page shows
what a command printed, never figures copied by hand. Each file holds the date, the command,
the machine (cores, RAM, PostgreSQL version, load average when the run began and ended: a
loaded machine says so) and the rows of the table the benchmark printed.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.helpers import pg


def _ram_gb() -> float:
    """The machine's RAM in GB (``MemTotal`` of ``/proc/meminfo``)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 1e6, 1)
    return 0.0


def machine(dsn: str) -> dict[str, Any]:
    """Cores, RAM, the PostgreSQL server's version and the load average now."""
    return {
        "cores": os.cpu_count(),
        "ram_gb": _ram_gb(),
        "postgresql": str(pg.fetch_one(dsn, "SHOW server_version")),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def write(
    path: str, bench: str, began: dict[str, Any], rows: list[dict[str, Any]], **facts: Any
) -> None:
    """Writes the result file: ``began`` is :func:`machine` at the start; the load average at
    the end is added."""
    document = {
        "bench": bench,
        "date": datetime.now(UTC).date().isoformat(),
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "machine": {**began, "load_average_end": [round(x, 2) for x in os.getloadavg()]},
        **facts,
        "rows": rows,
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(document, indent=2) + "\n")
