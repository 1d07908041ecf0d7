"""kill -9 at random moments, resume each time: nothing lost, nothing doubled, the chain holds."""

from __future__ import annotations

import random
import subprocess

import psycopg

from dpone_dagster.backfill import BackfillOptions
from tests.backfill.conftest import make_pair
from tests.helpers import crash, pg

ROWS = 200_000
BATCH = 4_000


def start_child(source: str, target: str, batch: int = BATCH) -> subprocess.Popen[str]:
    """One backfill run of ``public.mixed`` in its own process."""
    return crash.start_child("backfill", source, target, batch)


def consistent(target: str) -> tuple[int, int]:
    """(target rows, rows the ledger's receipts say were copied), read in ONE snapshot."""
    if not pg.table_exists(target, "dpone_ledger", "backfill_batch_receipts"):
        return int(pg.fetch_one(target, "SELECT count(*) FROM mixed")), 0  # type: ignore[call-overload]
    row = pg.fetch_all(
        target,
        "SELECT (SELECT count(*) FROM mixed),"
        " (SELECT coalesce(sum(copied_count), 0) FROM dpone_ledger.backfill_batch_receipts)",
    )[0]
    return int(row[0]), int(row[1])  # type: ignore[call-overload]


def test_kill_9_at_random_moments_loses_and_doubles_nothing(
    source_dsn: str, target_dsn: str
) -> None:
    pair = make_pair(source_dsn, target_dsn, ROWS)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    modes = ["copy", "commit", "committed", "timer"]
    outcomes = []
    for i in range(12):
        mode = modes[i % len(modes)]
        proc = start_child(pair.source, pair.target)
        outcomes.append((mode, crash.kill_at(proc, mode, rng.randint(1, 2), rng)))
        rows, copied = consistent(pair.target)
        assert rows == copied, f"seed {seed}: after {outcomes}: target {rows} != ledger {copied}"
    killed = sum(1 for _, o in outcomes if o == "killed")
    assert killed >= 10, (seed, outcomes)

    final = start_child(pair.source, pair.target)
    out, _ = final.communicate(timeout=120)
    assert final.returncode == 0 and out.rstrip().endswith(f"done {ROWS}"), out
    backfill = pair.backfill(BackfillOptions(batch_size=BATCH))
    run = backfill.verify()  # digest of the run and every link of the checkpoint chain
    assert run.progress.copied_count == ROWS and run.progress.duplicate_count == 0
    assert run.progress.batch_count == ROWS // BATCH
    src, dst = pair.fingerprints()
    assert src == dst and src[0] == ROWS, f"seed {seed}"
    assert pg.fetch_one(pair.target, "SELECT count(DISTINCT id) FROM mixed") == ROWS
    with psycopg.connect(pair.target) as conn:
        sequences = [
            r[0]
            for r in conn.execute(
                "SELECT sequence FROM dpone_ledger.backfill_batch_receipts ORDER BY sequence"
            )
        ]
    assert sequences == list(range(1, ROWS // BATCH + 1))
