"""Fixtures for the incremental tests: a mutable ``shop.orders`` source and an empty target
database, and helpers that read both sides."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from dpone_dagster.incremental import IncrementalOptions, IncrementalResult, IncrementalSync
from tests.helpers import pg

ORDERS = """
CREATE SCHEMA IF NOT EXISTS shop;
CREATE TABLE shop.orders (
    id bigint PRIMARY KEY,
    updated_at timestamptz NOT NULL DEFAULT now(),
    note text,
    amount numeric(12, 2)
);
CREATE INDEX orders_updated_at ON shop.orders (updated_at);
"""


@dataclass(frozen=True)
class Stream:
    """A source database with ``shop.orders`` and an empty target database."""

    source: str
    target: str

    def sync(self, **kwargs: Any) -> IncrementalSync:
        """The stream of ``shop.orders`` (cursor ``updated_at``): the ``kwargs`` that name an
        :class:`IncrementalOptions` field are its options (1,000-row batches and no check
        unless given), the others the engine's arguments (``target_table``, ``on_phase``...)."""
        fields: dict[str, Any] = {"batch_size": 1000, "reconcile": False}
        engine: dict[str, Any] = {"cursor": "updated_at"}
        for name, value in kwargs.items():
            (fields if name in IncrementalOptions.model_fields else engine)[name] = value
        options = IncrementalOptions(**fields)
        return IncrementalSync(self.source, self.target, "shop.orders", options=options, **engine)

    def run(self, **kwargs: Any) -> IncrementalResult:
        """One run of :meth:`sync`."""
        return self.sync(**kwargs).run()

    def source_rows(self, table: str = "shop.orders") -> list[tuple[object, ...]]:
        """Every source row, by key."""
        return pg.fetch_all(self.source, f"SELECT * FROM {table} ORDER BY 1")

    def target_rows(self, table: str = "shop.orders", live: str = "") -> list[tuple[object, ...]]:
        """Every target row of the source's columns, by key (``live``: a filter)."""
        cols = ", ".join(
            str(r[0])
            for r in pg.fetch_all(
                self.source,
                "SELECT quote_ident(attname) FROM pg_attribute WHERE attrelid = %s::regclass"
                " AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                (table,),
            )
        )
        where = f" WHERE {live}" if live else ""
        return pg.fetch_all(self.target, f"SELECT {cols} FROM {table}{where} ORDER BY 1")

    def assert_equal(self, table: str = "shop.orders", live: str = "") -> None:
        """The target holds exactly the source's rows."""
        source, target = self.source_rows(table), self.target_rows(table, live)
        assert len(target) == len(source)
        assert target == source


def insert_orders(dsn: str, first: int, count: int, note: str = "n") -> None:
    """Inserts orders ``first .. first+count-1`` (``updated_at = now()``)."""
    pg.execute(
        dsn,
        "INSERT INTO shop.orders (id, note, amount) SELECT g, %s || g, g * 1.25"
        " FROM generate_series(%s::bigint, %s::bigint) g",
        (note, first, first + count - 1),
    )


@pytest.fixture
def stream(source_dsn: str, target_dsn: str) -> Stream:
    """``shop.orders`` with 2,500 rows in the source, nothing in the target."""
    pg.execute(source_dsn, ORDERS)
    insert_orders(source_dsn, 1, 2500)
    return Stream(source_dsn, target_dsn)
