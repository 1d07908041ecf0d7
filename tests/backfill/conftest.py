"""Fixtures for the backfill tests: a mixed source table and an empty target of the same shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dpone_dagster.backfill import Backfill, BackfillOptions
from tests.helpers import pg


@dataclass(frozen=True)
class Pair:
    """A source database holding ``public.mixed`` and a target with the same empty table."""

    source: str
    target: str

    def backfill(self, options: BackfillOptions | None = None, **engine: Any) -> Backfill:
        """The backfill of ``public.mixed`` by ``id``, with ``options`` and the engine's other
        arguments (``ledger``, ``on_phase``, ``connection_options``...)."""
        return Backfill(
            self.source, self.target, "public.mixed", cursor="id", options=options, **engine
        )

    def fingerprints(self, table: str = "mixed") -> tuple[tuple[int, str], tuple[int, str]]:
        return (
            pg.table_fingerprint(self.source, "public", table),
            pg.table_fingerprint(self.target, "public", table),
        )


def copy_rows(source: str, target: str, query: str, table: str = "mixed") -> None:
    """Copies the rows of ``query`` (run on ``source``) into ``target``'s ``table`` (test setup)."""
    with psycopg.connect(source) as src, psycopg.connect(target) as dst:
        copy_in = sql.SQL("COPY {} FROM STDIN").format(sql.Identifier(table))
        with (
            src.cursor() as scur,
            dst.cursor() as dcur,
            scur.copy(f"COPY ({query}) TO STDOUT") as out,
            dcur.copy(copy_in) as inp,
        ):
            for block in out:
                inp.write(block)
        dst.commit()


def wait_for_older_transactions(dsn: str) -> None:
    """Waits until every transaction of ``dsn``'s server that began before now has ended.

    The row-version proof of a backfill's batch needs the batch's source rows written before
    the oldest transaction its snapshot saw in flight (:mod:`dpone_dagster.core.read_window`).
    One of another database is left out while its backend runs, but one that ends while the
    batch reads can no longer be told apart and is kept: another test's transaction that began
    before the rows were written and ends just then makes the rows look too new, and the batch
    is proven by hashing instead (correct, but not the cheap proof a test may assert; seen once
    in CI). After this wait every transaction in flight began after the rows were written."""
    now = pg.fetch_one(dsn, "SELECT pg_current_xact_id()::text")
    pg.wait_until(
        lambda: pg.fetch_one(
            dsn, "SELECT pg_snapshot_xmin(pg_current_snapshot()) > %s::xid8", (now,)
        ),
        timeout=120, what="the transactions that began before the rows were written end",
    )  # fmt: skip


def make_pair(source: str, target: str, rows: int) -> Pair:
    pg.create_mixed_table(source, rows=rows)
    pg.create_mixed_table(target, rows=0)
    return Pair(source, target)


@pytest.fixture
def pair(source_dsn: str, target_dsn: str) -> Pair:
    """5,000 mixed rows in the source, an empty target."""
    return make_pair(source_dsn, target_dsn, 5000)
