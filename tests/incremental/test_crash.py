"""Contract point 5 against a real server: ``kill -9`` of a run at random moments never loses or
doubles a row, the next run finishes the job and the stream's state only moves forward; two
concurrent runs of one stream never apply a batch twice."""

from __future__ import annotations

import itertools
import random
import subprocess

from dpone_dagster.incremental import IncrementalOptions, IncrementalSync, StreamReceipt
from tests.helpers import crash, pg
from tests.incremental.conftest import ORDERS, Stream, insert_orders

ROWS = 40_000
BATCH = 1_000


def start_child(stream: Stream, batch: int = BATCH) -> subprocess.Popen[str]:
    """One run of the stream of ``shop.orders`` in its own process."""
    return crash.start_child("incremental", stream.source, stream.target, batch)


def kill_at(proc: subprocess.Popen[str], mode: str, nth: int, rng: random.Random) -> str:
    """:func:`tests.helpers.crash.kill_at`, timed for this test's smaller batches."""
    return crash.kill_at(proc, mode, nth, rng, timer=0.3, inside_copy=0.005)


def ledger_view(target: str) -> tuple[int, int, tuple[int, int, int], list[int]]:
    """In ONE snapshot: target rows, inserted minus deleted by every receipt, the state's
    (runs, sequence, revision), and the receipts' sequence numbers."""
    if not pg.table_exists(target, "dpone_ledger", "incremental_batch_receipts"):
        return 0, 0, (0, 0, 0), []
    if not pg.table_exists(target, "shop", "orders"):  # killed before the first batch committed
        assert (
            pg.fetch_one(target, "SELECT count(*) FROM dpone_ledger.incremental_batch_receipts")
            == 0
        )
        return 0, 0, (0, 0, 0), []
    row = pg.fetch_all(
        target,
        "SELECT (SELECT count(*) FROM shop.orders),"
        " (SELECT coalesce(sum((receipt_json->>'inserted')::bigint"
        "   - (receipt_json->>'deleted')::bigint), 0)"
        "   FROM dpone_ledger.incremental_batch_receipts),"
        " (SELECT ARRAY[(state_json->>'runs')::bigint, (state_json->>'sequence')::bigint, revision]"
        "   FROM dpone_ledger.incremental_streams),"
        " ARRAY(SELECT sequence FROM dpone_ledger.incremental_batch_receipts ORDER BY sequence)",
    )[0]
    state = tuple(row[2]) if row[2] else (0, 0, 0)  # type: ignore[arg-type]
    return int(row[0]), int(row[1]), state, list(row[3])  # type: ignore[call-overload, arg-type, return-value]


def mutate(source: str, rng: random.Random, round_: int) -> None:
    """Updates, deletes and inserts spread over the table."""
    ids = rng.sample(range(1, ROWS + 1), 230)
    pg.execute(source, "UPDATE shop.orders SET note = 'u' || %s, updated_at = now()"
                       " WHERE id = ANY(%s)", (round_, ids[:200]))  # fmt: skip
    pg.execute(source, "DELETE FROM shop.orders WHERE id = ANY(%s)", (ids[200:],))
    insert_orders(source, 100_000 + round_ * 100, 50, note="r")


def _settle(stream: Stream) -> None:
    """Runs until a run finds nothing left (a resumed run's mark predates later changes)."""
    once = IncrementalOptions(deletes="hard", batch_size=BATCH, reconcile=False)
    sync = IncrementalSync(stream.source, stream.target, "shop.orders", cursor="updated_at",
                           options=once)  # fmt: skip
    sync.run()
    sync.run()


def test_kill_9_at_random_moments_loses_and_doubles_nothing(
    source_dsn: str, target_dsn: str
) -> None:
    pg.execute(source_dsn, ORDERS)
    insert_orders(source_dsn, 1, ROWS)
    stream = Stream(source_dsn, target_dsn)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    modes = ["copy", "apply", "commit", "committed", "timer"]
    outcomes, before = [], (0, 0, 0)
    for i in range(12):
        if i % 3 == 2:
            mutate(stream.source, rng, i)
        mode = modes[i % len(modes)]
        outcomes.append((mode, kill_at(start_child(stream), mode, rng.randint(1, 3), rng)))
        rows, net, state, sequences = ledger_view(stream.target)
        assert rows == net, f"seed {seed}: after {outcomes}: target {rows} != receipts {net}"
        assert sequences == list(range(1, state[1] + 1)), f"seed {seed}"
        assert state >= before, f"seed {seed}: the state moved back: {before} -> {state}"
        before = state
    killed = sum(1 for _, o in outcomes if o == "killed")
    assert killed >= 10, (seed, outcomes)
    _settle(stream)
    stream.assert_equal()
    rows, net, _, _ = ledger_view(stream.target)
    assert rows == net


def _chained(receipts: list[StreamReceipt]) -> bool:
    by_run = itertools.groupby(receipts, key=lambda r: r.run)
    return all(b.after == a.last for _, group in by_run for a, b in itertools.pairwise(list(group)))


def _receipts(stream: Stream) -> list[StreamReceipt]:
    rows = pg.fetch_all(
        stream.target,
        "SELECT receipt_json FROM dpone_ledger.incremental_batch_receipts ORDER BY sequence",
    )
    return [StreamReceipt.model_validate(r[0]) for r in rows]


def test_two_concurrent_runs_of_one_stream_never_apply_a_batch_twice(
    source_dsn: str, target_dsn: str
) -> None:
    pg.execute(source_dsn, ORDERS)
    insert_orders(source_dsn, 1, ROWS)
    stream = Stream(source_dsn, target_dsn)
    rng = random.Random(7)
    seen = 0
    for round_ in range(3):
        if round_:
            mutate(stream.source, rng, round_)
        children = [start_child(stream), start_child(stream)]
        outputs = [c.communicate(timeout=120)[0] for c in children]
        assert all(c.returncode == 0 for c in children), outputs
        receipts = _receipts(stream)
        # Each batch was committed by exactly one of the two, and batches chain without overlap.
        assert sum(o.count("committed") for o in outputs) == len(receipts) - seen
        assert _chained(receipts)
        seen = len(receipts)
        rows, net, state, sequences = ledger_view(stream.target)
        assert rows == net and sequences == list(range(1, state[1] + 1))
        if round_ == 0:
            assert sum(r.rows for r in receipts) == ROWS  # no row read twice
    _settle(stream)
    stream.assert_equal()
