"""Contract point 1 against a real server: late commits are never missed, for a timestamp cursor
(``updated_at = now()``) and a sequence cursor (``nextval``); an idle transaction bounds the wait
and never stalls the stream; a client clock behind the server needs ``lookback``."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import psycopg
import pytest

from dpone_dagster.incremental import IncrementalOptions, IncrementalResult, IncrementalSync
from tests.helpers import pg
from tests.incremental.conftest import Stream

EVENTS = """
CREATE TABLE shop.events (id bigserial PRIMARY KEY, note text NOT NULL);
INSERT INTO shop.events (note) SELECT 'e' || g FROM generate_series(1, 300) g;
"""


def _writer(dsn: str, statement: str) -> psycopg.Connection[tuple[object, ...]]:
    """A session that ran ``statement`` in a transaction it keeps open."""
    conn = psycopg.connect(dsn)
    conn.execute(statement)
    return conn


def test_a_timestamp_late_commit_below_the_mark_is_copied_by_the_next_run(stream: Stream) -> None:
    stream.run()
    late = _writer(stream.source, "UPDATE shop.orders SET note = 'late', updated_at = now()"
                                  " WHERE id = 5")  # fmt: skip
    pg.execute(stream.source, "UPDATE shop.orders SET note = 'early', updated_at = now()"
                              " WHERE id = 6")  # fmt: skip
    first = stream.run(settle_timeout=0.3)
    assert [n.code for n in first.notices] == ["incremental_mark_unsettled"]
    assert first.rows == 1  # row 6; row 5 is not committed yet
    late.commit()
    late.close()
    below = pg.fetch_one(stream.source, "SELECT updated_at <= %s::timestamptz FROM shop.orders"
                                        " WHERE id = 5", (first.new_mark,))  # fmt: skip
    assert below is True  # the trap: committed after the run, with a cursor below its mark
    second = stream.run(settle_timeout=0.3)
    assert second.notices == ()
    assert second.updated >= 1
    stream.assert_equal()
    assert pg.fetch_one(stream.target, "SELECT note FROM shop.orders WHERE id = 5") == "late"


def test_a_sequence_late_commit_below_the_mark_is_copied_by_the_next_run(stream: Stream) -> None:
    pg.execute(stream.source, EVENTS)
    events = Stream(stream.source, stream.target)
    options = IncrementalOptions(settle_timeout=0.3, reconcile=False)
    table = "shop.events"

    def run() -> IncrementalResult:
        return IncrementalSync(events.source, events.target, table, cursor="id",
                               options=options).run()  # fmt: skip

    assert run().rows == 300
    late = _writer(events.source, "INSERT INTO shop.events (note) VALUES ('late')")  # id 301
    pg.execute(events.source, "INSERT INTO shop.events (note) VALUES ('early')")  # id 302
    first = run()
    assert first.new_mark == "302" and first.notices
    late.commit()
    late.close()
    second = run()
    assert (second.rows, second.inserted) == (2, 1)  # 301, and 302 read again (unchanged)
    events.assert_equal(table)
    assert run().notices == ()


def _run_in_thread(sync: IncrementalSync) -> tuple[threading.Thread, list[IncrementalResult]]:
    results: list[IncrementalResult] = []
    thread = threading.Thread(target=lambda: results.append(sync.run()))
    thread.start()
    return thread, results


def test_a_writer_that_commits_during_the_wait_is_copied_by_the_same_run(stream: Stream) -> None:
    stream.run()
    late = _writer(stream.source, "UPDATE shop.orders SET note = 'late', updated_at = now()"
                                  " WHERE id = 9")  # fmt: skip
    pg.execute(stream.source, "UPDATE shop.orders SET updated_at = now() WHERE id = 10")
    thread, results = _run_in_thread(stream.sync(settle_timeout=60))
    pg.wait_until(
        lambda: pg.fetch_one(
            stream.source,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'dpone-dagster' AND query LIKE '%%l.virtualxid = ANY%%'",
        ) == 1,
        timeout=30,
        what="the run waiting for the writer",
    )  # fmt: skip
    late.commit()
    late.close()
    thread.join(60)
    (result,) = results
    assert result.awaited >= 1 and result.notices == ()
    assert result.rows == 2
    stream.assert_equal()


def test_an_idle_transaction_bounds_the_wait_and_never_stalls_the_stream(stream: Stream) -> None:
    stream.run()
    idle = _writer(stream.source, "SELECT 1")  # unrelated, idle in transaction
    try:
        for i in range(3):
            pg.execute(stream.source, "UPDATE shop.orders SET updated_at = now() WHERE id = %s",
                       (100 + i,))  # fmt: skip
            started = time.monotonic()
            result = stream.run(settle_timeout=0.5)
            assert time.monotonic() - started < 10
            assert [n.code for n in result.notices] == ["incremental_mark_unsettled"]
            stream.assert_equal()
    finally:
        idle.close()
    assert stream.run(settle_timeout=0.5).notices == ()


def test_a_client_clock_behind_the_server_needs_lookback(stream: Stream) -> None:
    stream.run()
    # A client sets the cursor from its own clock, a minute behind, after the mark was taken.
    pg.execute(stream.source, "UPDATE shop.orders SET note = 'behind',"
                              " updated_at = now() - interval '1 minute' WHERE id = 3")  # fmt: skip
    assert stream.run().rows == 0  # the stated limit: below the mark, never read
    caught = stream.run(lookback=timedelta(minutes=2))
    assert caught.updated == 1
    stream.assert_equal()


def test_lookback_is_refused_for_an_integer_cursor(stream: Stream) -> None:
    options = IncrementalOptions(lookback=timedelta(minutes=1))
    with pytest.raises(Exception, match="lookback") as info:
        IncrementalSync(stream.source, stream.target, "shop.orders", cursor="id",
                        options=options).run()  # fmt: skip
    assert getattr(info.value, "code", None) == "incremental_options_invalid"
