"""The stream check whose cost follows the run (``check="run"``, the default): the run's keys
exactly, and a rolling sweep of the key whose position is kept in the ledger."""

from __future__ import annotations

import pytest

from dpone_dagster.core.errors import EngineError
from dpone_dagster.incremental import Sweep
from tests.helpers import pg
from tests.incremental.conftest import Stream

SLICE = Sweep(rows=500)
"""2,500 source rows in slices of 500: a full sweep in five runs."""


def _touch(dsn: str, ids: str) -> None:
    pg.execute(dsn, f"UPDATE shop.orders SET note = note || '+', updated_at = now() WHERE {ids}")


def test_a_run_verifies_exactly_the_keys_it_copied_and_catches_one_that_differs(
    stream: Stream,
) -> None:
    first = stream.run(reconcile=True, sweep=SLICE)
    check = first.verification
    assert check is not None and check.ok and check.scope == "run"
    assert check.keys_checked == 2500  # the initial load: every key is the run's
    _touch(stream.source, "id BETWEEN 10 AND 20")
    second = stream.run(reconcile=True, sweep=SLICE)
    check = second.verification
    assert check is not None and check.ok
    assert (second.updated, check.keys_checked, check.ranges_checked) == (11, 11, 1)
    # A target trigger rewrites one row the merge applies: the run's own key now differs,
    # while the sweep's slice of this run is elsewhere ((1000, 1500]).
    pg.execute(
        stream.target,
        "CREATE FUNCTION shop.garble() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN IF NEW.id = 15 THEN NEW.note := 'garbled'; END IF; RETURN NEW; END $$;"
        " CREATE TRIGGER garble BEFORE UPDATE ON shop.orders FOR EACH ROW"
        " EXECUTE FUNCTION shop.garble()",
    )
    _touch(stream.source, "id BETWEEN 10 AND 20")
    third = stream.run(reconcile=True, sweep=SLICE)
    check = third.verification
    assert check is not None and not check.ok
    assert (check.keys_checked, check.unexplained, check.examples) == (11, 1, (("15",),))
    assert check.ranges_checked == 1 and check.rows_swept == 500


def test_a_key_changed_again_after_the_mark_is_left_to_the_next_run_and_counted(
    stream: Stream,
) -> None:
    stream.run(reconcile=True, sweep=SLICE)
    _touch(stream.source, "id <= 1500")  # two batches of 1,000

    def change_again(phase: str, seen: list[str] = []) -> None:  # noqa: B006
        seen.append(phase)
        if seen.count("copy") == 1 and phase == "copy":  # the first batch: after the mark
            _touch(stream.source, "id = 1400")

    second = stream.sync(reconcile=True, sweep=SLICE, on_phase=change_again).run()
    check = second.verification
    assert check is not None and check.ok
    assert check.keys_checked == 1499 and check.changed_since_mark == 1
    third = stream.run(reconcile=True, sweep=SLICE)
    check = third.verification
    assert check is not None and check.ok
    assert (third.updated, check.keys_checked, check.changed_since_mark) == (1, 1, 0)
    stream.assert_equal()


def test_the_sweep_catches_a_corruption_outside_the_runs_keys_within_its_bound(
    stream: Stream,
) -> None:
    stream.run(reconcile=True, sweep=SLICE)  # slice 1: keys (-inf, 500]
    pg.execute(stream.target, "UPDATE shop.orders SET amount = -1 WHERE id = 1800")
    verdicts = []
    for _ in range(4):  # nothing changed: (500, 1000], (1000, 1500], (1500, 2000], (2000, +inf)
        check = stream.run(reconcile=True, sweep=SLICE).verification
        assert check is not None and check.keys_checked == 0 and check.ranges_checked == 1
        verdicts.append((check.ok, check.examples, check.swept_at))
    assert verdicts[:2] == [(True, (), None)] * 2  # not yet in the slice: not claimed
    assert verdicts[2] == (False, (("1800",),), None)  # caught within the bound: the 4th run
    # The range that differed is verified again by every run until it agrees, and the sweep
    # that met it is no full sweep.
    assert verdicts[3] == (False, (("1800",),), None)
    pg.execute(stream.target, "UPDATE shop.orders SET amount = 1800 * 1.25 WHERE id = 1800")
    check = stream.run(reconcile=True, sweep=SLICE).verification
    assert check is not None and check.ok and check.swept_at is None


def test_the_metadata_says_what_was_swept_and_the_position_is_in_the_ledger(
    stream: Stream,
) -> None:
    pg.execute(stream.source, "ANALYZE shop.orders")  # the row estimate: 2,500
    checks = [stream.run(reconcile=True, sweep=SLICE).verification for _ in range(6)]
    assert all(c is not None and c.ok for c in checks)
    assert [c.ranges_total for c in checks if c] == [5] * 6
    assert [c.swept_at is None for c in checks if c] == [True] * 4 + [False] * 2
    done = checks[4]
    assert done is not None and done.sweep_started_at is None
    assert done.swept_from == checks[0].proved_at  # type: ignore[union-attr]
    assert done.swept_at == done.proved_at
    stored = pg.fetch_one(
        stream.target,
        "SELECT sweep_json::text FROM dpone_ledger.incremental_sweeps",
    )
    assert isinstance(stored, str) and '"sweeps": 1' in stored and '"after": ["500"]' in stored
    # A crashed or concurrent reader sees the committed position only: the ledger row moved
    # with the sixth run's batch.
    assert checks[5] is not None and checks[5].sweep_started_at == checks[5].proved_at


def test_a_seconds_budget_sweeps_until_spent_and_a_bad_budget_is_refused(stream: Stream) -> None:
    check = stream.run(reconcile=True, sweep=Sweep(seconds=30)).verification
    assert check is not None and check.ok and check.ranges_checked == 1  # one slice: the table
    assert check.swept_at == check.proved_at
    for bad in ({"rows": 0}, {"runs": -1}, {"rows": 10, "seconds": 1.0}):
        with pytest.raises(EngineError) as caught:
            Sweep(**bad)  # type: ignore[arg-type]
        assert caught.value.code == "incremental_options_invalid"
    with pytest.raises(EngineError) as caught:
        stream.sync(reconcile=True, check="partial")
    assert caught.value.code == "incremental_options_invalid"


def test_the_full_check_stays_available(stream: Stream) -> None:
    stream.run(reconcile=True, sweep=SLICE)
    pg.execute(stream.target, "UPDATE shop.orders SET amount = -1 WHERE id = 2400")
    run = stream.run(reconcile=True, sweep=SLICE).verification
    assert run is not None and run.ok  # not in this run's keys nor its slice
    full = stream.run(reconcile=True, check="full").verification
    assert full is not None and not full.ok and full.scope == "full"
    assert full.examples == (("2400",),) and full.proved_at is not None
    alone = stream.sync().check()
    assert alone is not None and not alone.ok and alone.examples == (("2400",),)


@pytest.mark.parametrize("reconcile", [False, True])
def test_sweep_deletes_find_what_the_source_lost_within_one_full_sweep(
    stream: Stream, reconcile: bool
) -> None:
    pg.execute(stream.source, "ANALYZE shop.orders")
    first = stream.run(deletes="sweep", sweep=SLICE, reconcile=reconcile)  # slice 1: (-inf, 500]
    assert first.deleted == 0
    # The worst case for 100: deleted right after its range was swept; 2200 is in the last.
    pg.execute(stream.source, "DELETE FROM shop.orders WHERE id IN (100, 2200)")
    deleted, compared = [], []
    for _ in range(5):  # (500, 1000], ..., (2000, +inf), then (-inf, 500] again
        run = stream.run(deletes="sweep", sweep=SLICE, reconcile=reconcile)
        deleted.append(run.deleted)
        compared.append(run.keys_compared)
        if reconcile:
            assert run.verification is not None and run.verification.ok
            assert run.verification.ranges_total == 5  # the longest delay, in runs
    assert deleted == [0, 0, 0, 1, 1]  # 2200 on the 4th run, 100 on the 5th: one full sweep
    # A slice that finds nothing to delete commits no batch; one that does, a batch whose
    # receipt records the deletes (the initial load's three batches, then those two).
    receipts = pg.fetch_all(
        stream.target,
        "SELECT (receipt_json->>'deleted')::int FROM dpone_ledger.incremental_batch_receipts"
        " ORDER BY sequence",
    )
    assert receipts == [(0,), (0,), (0,), (1,), (1,)]
    # A run's cost is its slice: no run counted or compared the whole key set.
    assert max(compared) <= 2 * SLICE.rows + 2  # type: ignore[operator]
    stream.assert_equal()


def test_a_composite_text_key_is_swept_and_checked_the_same_way(
    source_dsn: str, target_dsn: str
) -> None:
    from dpone_dagster.incremental import IncrementalOptions, IncrementalSync

    pg.execute(
        source_dsn,
        "CREATE SCHEMA shop; CREATE TABLE shop.lines (region text, n int, at bigint NOT NULL,"
        " qty int, PRIMARY KEY (region, n)); CREATE INDEX ON shop.lines (at);"
        " INSERT INTO shop.lines SELECT (ARRAY['north', 'south', 'Ost'])[1 + g %% 3], g, g, g"
        " FROM generate_series(1, 3000) g; ANALYZE shop.lines",
    )

    def run() -> tuple[bool, tuple[tuple[str, ...], ...], int]:
        sync = IncrementalSync(source_dsn, target_dsn, "shop.lines", cursor="at",
                               options=IncrementalOptions(sweep=Sweep(rows=1000)))  # fmt: skip
        check = sync.run().verification
        assert check is not None and check.scope == "run"
        return check.ok, check.examples, check.ranges_total

    assert run() == (True, (), 3)
    changed = "UPDATE shop.lines SET qty = -1 WHERE region = 'south' AND n = 1 RETURNING n"
    assert pg.fetch_all(target_dsn, changed) == [(1,)]
    pg.execute(source_dsn, "UPDATE shop.lines SET qty = 0, at = 5000 WHERE n = 7")
    verdicts = [run() for _ in range(3)]  # the three slices, in the key's (collation) order
    oks = [v[0] for v in verdicts]
    assert False in oks and not any(oks[oks.index(False) :])  # caught, then kept failing
    assert all(v[1] in ((), (("south", "1"),)) for v in verdicts), verdicts
