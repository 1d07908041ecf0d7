"""Generated columns keep their kind where the target can: a ``VIRTUAL`` one (PostgreSQL 18)
stays ``VIRTUAL`` on an 18 target and becomes ``STORED`` on an older one, which the report and
the materialization's metadata say; the values are equal either way. Every entry point that
creates a target does so: the snapshot copy, the backfill, the incremental stream."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dpone_dagster.backfill import Backfill, prepare_target
from dpone_dagster.dagster.metadata.receipts import created_metadata, table_metadata
from dpone_dagster.incremental import IncrementalOptions, IncrementalSync
from dpone_dagster.postgres import TableName
from dpone_dagster.snapshot_copy import copy_tables
from tests.helpers import pg

PRICES = """
CREATE TABLE public.prices (
    id int PRIMARY KEY, net numeric(10,2), rate numeric(4,3),
    gross numeric GENERATED ALWAYS AS (net * (1 + rate)) VIRTUAL,
    label text GENERATED ALWAYS AS ('#' || id) STORED
);
INSERT INTO public.prices (id, net, rate) VALUES (1, 10.50, 0.2), (2, NULL, 0.1), (3, 99.99, 0);
"""

_KINDS = (
    "SELECT attname::text, attgenerated::text FROM pg_attribute"
    " WHERE attrelid = 'public.prices'::regclass AND attgenerated <> '' ORDER BY attnum"
)
_VALUES = "SELECT id, net, gross, label FROM public.prices ORDER BY id"
PRICES_TABLE = TableName("public", "prices")


def _copy(source_dsn: str, target_dsn: str) -> tuple[str, ...]:
    report = copy_tables(source_dsn, target_dsn, ["public.prices"])
    table = report.tables[0]
    listed = table_metadata(report, table).get("dpone/virtual_as_stored")
    assert (listed.data if listed else []) == [
        {"column": c, "source": "VIRTUAL", "target": "STORED"} for c in table.virtual_as_stored
    ]
    return table.virtual_as_stored


def _backfill(source_dsn: str, target_dsn: str) -> tuple[str, ...]:
    prepared = prepare_target(source_dsn, target_dsn, PRICES_TABLE, PRICES_TABLE, "id")
    assert prepared.created
    Backfill(source_dsn, target_dsn, "public.prices", cursor="id").run()
    return prepared.virtual_as_stored


def _incremental(source_dsn: str, target_dsn: str) -> tuple[str, ...]:
    unchecked = IncrementalOptions(reconcile=False)
    result = IncrementalSync(
        source_dsn, target_dsn, "public.prices", cursor="id", options=unchecked
    ).run()
    metadata = created_metadata(result.target_types, result.virtual_as_stored)
    assert bool(metadata) == bool(result.virtual_as_stored)
    return result.virtual_as_stored


def _major(version: int) -> Callable[[str], bool]:
    return lambda server: pg.server_version(server) == version


@pytest.mark.cross_server
@pytest.mark.parametrize("entry", [_copy, _backfill, _incremental])
@pytest.mark.parametrize(("target_version", "gross_kind"), [(18, "v"), (15, "s")])
def test_a_virtual_generated_column_stays_virtual_on_18_and_becomes_stored_before(
    make_database: Callable[..., str],
    target_version: int,
    gross_kind: str,
    entry: Callable[[str, str], tuple[str, ...]],
) -> None:
    source_server = pg.server_where(_major(18), "PostgreSQL 18 (VIRTUAL generated columns)")
    target_server = pg.server_where(_major(target_version), f"PostgreSQL {target_version}")
    source_dsn = make_database("dpone_src", source_server)
    target_dsn = make_database("dpone_tgt", target_server)
    pg.execute(source_dsn, PRICES)

    stored = entry(source_dsn, target_dsn)

    assert pg.fetch_all(target_dsn, _KINDS) == [("gross", gross_kind), ("label", "s")]
    assert pg.fetch_all(target_dsn, _VALUES) == pg.fetch_all(source_dsn, _VALUES)
    assert stored == (("gross",) if gross_kind == "s" else ())
