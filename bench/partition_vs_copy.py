"""A backfill partition beside the snapshot copy of the same table, for ``bench/snapshot_copy.py``.

Its ``dagster:backfill`` and ``cold:backfill`` rows time one ``0..rows`` partition of
``backfill_asset`` (``bench/backfill.py``'s asset) among the snapshot copy's rows; this module
prints each round's partition ratio over the copy's ratio of the same kind and round, and the
floor under it: the raw pipe into a new table loaded with ``FREEZE`` and keyed afterwards (the
snapshot copy's way to load) beside the raw pipe into the table with its key (the way a
backfill batch must load: into the table users query, whose key finds the rows a batch already
holds). The keyed pipe's share of the frozen one is the most a partition's ratio over the
copy's can reach on this machine, whatever the engine spends beside the load. Beside them, the
raw pipe into a new unkeyed table made before the load and keyed afterwards: the most a
backfill could reach that built the key of a target it created once its rows are in.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from typing import Any

from bench import pipe
from tests.helpers import pg

BACKFILL_OF_COPY = 0.9
"""The issue's target: a backfill partition's ratio to the pipe over the snapshot copy's."""


FROZEN = "public._dpone_frozen"


def frozen_pipe(source: str, target: str) -> float:
    """Seconds of the raw pipe into a new table created in the load's transaction, loaded with
    ``FREEZE`` and keyed afterwards (``ADD PRIMARY KEY``): the snapshot copy's way to load, where
    the raw pipe loads the way a backfill batch must, into the table with its key."""
    return _pipe_into_new_table(source, target, frozen=True)


def deferred_pipe(source: str, target: str) -> float:
    """Seconds of the raw pipe into a new table without a key, created before the load (no
    ``FREEZE``: a backfill's batches cannot load into a table their own transaction made), then
    keyed (``ADD PRIMARY KEY``): the most a backfill could reach that built the key of a target
    it created once its rows are in, instead of loading into the keyed table."""
    return _pipe_into_new_table(source, target, frozen=False)


def _pipe_into_new_table(source: str, target: str, *, frozen: bool) -> float:
    """The raw pipe into a new unkeyed table, keyed after the load (see the two callers)."""
    pg.execute(target, f"DROP TABLE IF EXISTS {FROZEN}")
    create = f"CREATE TABLE {FROZEN} (LIKE public.mixed INCLUDING DEFAULTS)"
    if not frozen:  # the table exists before the load's transaction, as a backfill's does
        pg.execute(target, create)
    pg.execute(target, "CHECKPOINT")
    out = [*pipe.psql_args(source), "-c", "COPY public.mixed TO STDOUT (FORMAT binary)"]
    copy = f"COPY {FROZEN} FROM STDIN (FORMAT binary{', FREEZE' if frozen else ''})"
    load = [
        *pipe.psql_args(target), "-c", "BEGIN", *(["-c", create] if frozen else []),
        "-c", copy, *(["-c", "COMMIT", "-c", "BEGIN"] if not frozen else []),
        "-c", f"ALTER TABLE {FROZEN} ADD PRIMARY KEY (id)", "-c", "COMMIT",
    ]  # fmt: skip
    started = time.perf_counter()
    producer = subprocess.Popen(out, stdout=subprocess.PIPE)
    subprocess.run(load, stdin=producer.stdout, check=True, stdout=subprocess.DEVNULL)
    assert producer.stdout is not None
    producer.stdout.close()
    if producer.wait() != 0:
        raise RuntimeError("the psql pipe into a new table failed")
    seconds = time.perf_counter() - started
    pg.execute(target, f"DROP TABLE {FROZEN}")
    return seconds


def load_cell(runs: list[dict[str, Any]]) -> str:
    """The one-minute load average read before the row's runs: its lowest and highest."""
    loads = [r["load"] for r in runs]
    return f"{min(loads):.2f}-{max(loads):.2f}"


def _share_row(
    name: str, shares: list[float], pipes: list[float], limit: float, **cells: object
) -> tuple[dict[str, object], str]:
    """A share's result row (best and median, ``refused`` past the pipe's spread limit, the
    pipe's seconds and spread; ``cells`` fill the rest) and its printed ratios."""
    best = pipe.ratio_cell(max(shares), pipes, limit)
    median = pipe.ratio_cell(statistics.median(shares), pipes, limit)
    pipe_s, pipe_spread = pipe.pipe_cells(pipes)
    row: dict[str, object] = {
        "strategy": name, "best_seconds": "", "rows_per_second": "", "ratio_best": best,
        "ratio_median": median, "pipe_seconds": pipe_s, "pipe_spread": pipe_spread,
        "target": "", "peak_rss_mb": "", "load": "",
    }  # fmt: skip
    return {**row, **cells}, f"{name:<56} ratios best {best}, median {median}"


Floor = tuple[float, float, float]
"""One round's floor: the keyed raw pipe, the frozen-then-keyed pipe, the deferred-key pipe."""


_FLOORS = (
    ("ceiling: keyed pipe, of the frozen-then-keyed pipe", 0, 1, "keyed",
     "the most a load into the keyed table reaches of the snapshot copy's load"),
    ("ceiling: key built after the load, of the frozen-then-keyed pipe", 2, 2, "deferred",
     "the most a backfill reaches that keys a target it created once its rows are in"),
)  # fmt: skip
"""Each floor row: its name, its pipe's place in a :data:`Floor`, the place of the pipe whose
best seconds the row shows, the pipe's name, what it is."""


def load_floor(floors: list[Floor], limit: float) -> list[dict[str, object]]:
    """The floor under ``backfill partition / snapshot copy``: each round's frozen-then-keyed
    pipe over the keyed raw pipe right before it, and over the deferred-key pipe after it
    (best, median), as result rows."""
    if not floors:
        return []
    rows = []
    for name, place, shown, pipe_name, meaning in _FLOORS:
        row, line = _share_row(
            name, [f[1] / f[place] for f in floors], [f[0] for f in floors], limit,
            best_seconds=round(min(f[shown] for f in floors), 2),
        )  # fmt: skip
        seconds = ", ".join(f"{f[place]:.2f} / {f[1]:.2f}" for f in floors)
        print(f"{line}: {meaning}; each round's {pipe_name} / frozen pipe seconds {seconds}")
        rows.append(row)
    return rows


def backfill_of_copy(
    runs: dict[str, list[dict[str, Any]]], limit: float
) -> list[dict[str, object]]:
    """Per kind (``dagster``, ``cold``) run with both: each round's backfill ratio over the
    snapshot copy's ratio of the same round (best, median), as result rows."""
    found: list[dict[str, object]] = []
    for kind in ("dagster", "cold"):
        copies, partitions = runs.get(f"{kind}:batched_copy"), runs.get(f"{kind}:backfill")
        if not copies or not partitions:
            continue
        shares = [b["ratio"] / c["ratio"] for c, b in zip(copies, partitions, strict=True)]
        times = [c["seconds"] / b["seconds"] for c, b in zip(copies, partitions, strict=True)]
        row, line = _share_row(
            f"{kind}: backfill partition / snapshot copy (same round)", shares,
            [p for r in (*copies, *partitions) for p in r["pipes"]], limit,
            target=BACKFILL_OF_COPY, load=load_cell([*copies, *partitions]),
        )  # fmt: skip
        print(f"{line} (target {BACKFILL_OF_COPY}); each round's: "
              f"{', '.join(f'{r:.2f}' for r in shares)}; its seconds, copy over partition: "
              f"{', '.join(f'{t:.2f}' for t in times)}")  # fmt: skip
        found.append(row)
    return found
