"""Several processes on one run: each batch applied once; a loser waits (or is told it is stale)."""

from __future__ import annotations

from dpone_dagster.backfill import Backfill
from tests.backfill.conftest import make_pair
from tests.backfill.test_crash import start_child
from tests.helpers import pg

ROWS = 30_000
BATCH = 1_000


def test_three_processes_on_one_run_apply_every_batch_exactly_once(
    source_dsn: str, target_dsn: str
) -> None:
    pair = make_pair(source_dsn, target_dsn, ROWS)
    children = [start_child(pair.source, pair.target, BATCH) for _ in range(3)]
    outputs = [child.communicate(timeout=180)[0].split("\n") for child in children]
    committed: list[int] = []
    for child, lines in zip(children, outputs, strict=True):
        assert child.returncode == 0 or "error backfill_checkpoint_stale" in lines, lines
        committed += [int(line.split()[1]) for line in lines if line.startswith("committed")]
    # Every batch was committed by exactly one process (the others replayed it or waited).
    assert sorted(committed) == list(range(1, ROWS // BATCH + 1))
    # The others waited on the run's lock and were answered by replay: they really overlapped.
    assert any(x.startswith("replayed") for lines in outputs for x in lines)
    run = Backfill(pair.source, pair.target, "public.mixed", cursor="id").verify()
    assert run.progress.copied_count == ROWS and run.progress.duplicate_count == 0
    src, dst = pair.fingerprints()
    assert src == dst
    assert pg.fetch_one(pair.target, "SELECT count(DISTINCT id) FROM mixed") == ROWS
