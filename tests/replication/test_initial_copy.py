"""Contract point 3 against real servers: the initial copy is read under the slot's exported
snapshot, so writers running during it lose and double nothing; a target that already holds
rows is taken over only with ``adopt=True``."""

from __future__ import annotations

import threading

import psycopg
import pytest

from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres.snapshot import EXPORTED_SNAPSHOT
from tests.helpers import pg
from tests.helpers.logical import OWN_SLOTS
from tests.replication.group import Group

EVENTS = """
CREATE TABLE public.events (id bigint PRIMARY KEY, n bigint NOT NULL, note text);
INSERT INTO public.events SELECT g, 0, repeat('x', 200) FROM generate_series(1, 200000) g;
"""


def test_writers_during_the_initial_copy_lose_and_double_nothing(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    pg.execute(src, EVENTS)
    stop = threading.Event()
    written = [0]

    def write() -> None:
        with psycopg.connect(src, autocommit=True) as conn:
            while not stop.is_set():
                written[0] += 1
                i = written[0]
                with conn.transaction():
                    conn.execute("INSERT INTO public.events VALUES (%s, 1, 'w')", (1_000_000 + i,))
                    conn.execute("UPDATE public.events SET n = n + 1 WHERE id = %s", (i,))
                    conn.execute("DELETE FROM public.events WHERE id = %s", (100_000 + i,))

    writer = threading.Thread(target=write)
    writer.start()
    group = Group(src, target_dsn, ("public.events",))
    try:
        first = group.run()
    finally:
        stop.set()
        writer.join()
    assert written[0] > 0
    assert first.initial_copy is not None
    receipt = first.initial_copy.tables[0].extraction_receipt
    assert receipt is not None and receipt.snapshot_authority == EXPORTED_SNAPSHOT
    group.run()
    group.assert_equal()


def test_a_filled_target_is_refused_unless_adopted(
    logical_source_dsn: str, target_dsn: str
) -> None:
    src = logical_source_dsn
    pg.execute(
        src,
        "CREATE TABLE public.t (id int PRIMARY KEY, v text);"
        "INSERT INTO public.t SELECT g, 'v' || g FROM generate_series(1, 100) g",
    )
    pg.execute(
        target_dsn,
        "CREATE TABLE public.t (id int PRIMARY KEY, v text);"
        "INSERT INTO public.t SELECT g, 'old' FROM generate_series(1, 50) g",
    )
    group = Group(src, target_dsn, ("public.t",))
    with pytest.raises(DponeError) as err:
        group.run()
    assert err.value.code == "replication_target_exists"
    assert pg.fetch_one(src, OWN_SLOTS) == 0
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM public.t WHERE v = 'old'") == 50
    adopted = group.run(adopt=True)
    assert adopted.adopted and adopted.initial_copy is not None
    group.assert_equal()
    pg.execute(src, "UPDATE public.t SET v = 'new' WHERE id = 1")
    group.run()
    group.assert_equal()
