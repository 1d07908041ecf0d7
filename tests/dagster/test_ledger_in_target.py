"""A ledger DSN that names the target's own database is the default ledger, through Dagster.

``LedgerResource(dsn=<the target's DSN>)``, or any DSN with the target's host, port and
database, behaves exactly as ``LedgerResource()``: an incremental asset accepts it, and a
backfill batch's rows and its receipt commit in ONE target transaction (a trigger records the
transaction that writes each batch's rows; each receipt row was written by one of them). A
ledger in a really different database keeps its behaviour: the backfill writes its receipts
there in transactions of their own, and an incremental asset refuses it with
``incremental_options_invalid``
(``tests/dagster/test_incremental_asset.py::test_a_ledger_in_another_database_is_refused``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dagster as dg
import pytest
from psycopg import conninfo

from dpone_dagster import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
    backfill_asset,
    cursor_range_partitions,
    incremental_asset,
)
from tests.helpers import pg
from tests.incremental.conftest import ORDERS, Stream, insert_orders

SPELLINGS = ["the-target-dsn", "key-value-with-other-parameters"]


def spelled(target_dsn: str, spelling: str) -> str:
    """The target's DSN itself, or its database named another way (another application name)."""
    if spelling == "the-target-dsn":
        return target_dsn
    return conninfo.make_conninfo(target_dsn, application_name="dpone-ledger", connect_timeout=7)


def resources(source_dsn: str, target_dsn: str, ledger_dsn: str | None) -> dict[str, Any]:
    return {
        "source": PostgresSourceResource(dsn=source_dsn),
        "target": PostgresTargetResource(dsn=target_dsn),
        "ledger": LedgerResource(dsn=ledger_dsn),
    }


# The rows of a batch are written inside a savepoint, whose rows carry the subtransaction's
# xmin: the trigger records the top-level transaction instead (pg_current_xact_id).
WRITERS = """
CREATE TABLE public.writers (xact text NOT NULL);
CREATE FUNCTION public.record_writer() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.writers VALUES (pg_current_xact_id()::text);
    RETURN NULL;
END $$;
CREATE TRIGGER record_writer AFTER INSERT ON public.mixed
    FOR EACH STATEMENT EXECUTE FUNCTION public.record_writer();
"""
RECEIPTS = "dpone_ledger.backfill_batch_receipts"


def tables(source_dsn: str, target_dsn: str) -> dg.AssetsDefinition:
    """1,000 rows to backfill in batches of 300, a target that records its writers."""
    pg.create_mixed_table(source_dsn, rows=1000)
    pg.create_mixed_table(target_dsn, rows=0)
    pg.execute(target_dsn, WRITERS)
    return backfill_asset(
        "public.mixed", cursor="id", partitions_def=cursor_range_partitions(0, 1000, 1000),
        batch_size=300,
    )  # fmt: skip


def writers(target_dsn: str) -> set[str]:
    """The transactions that wrote the target's rows."""
    return {str(r[0]) for r in pg.fetch_all(target_dsn, "SELECT xact FROM public.writers")}


def receipt_writers(ledger_dsn: str) -> set[str]:
    """The transactions that wrote the ledger's batch receipts."""
    return {str(r[0]) for r in pg.fetch_all(ledger_dsn, f"SELECT xmin::text FROM {RECEIPTS}")}


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_backfill_commits_rows_and_receipt_in_one_target_transaction(
    source_dsn: str, target_dsn: str, spelling: str
) -> None:
    asset = tables(source_dsn, target_dsn)
    ledger = spelled(target_dsn, spelling)
    result = dg.materialize(
        [asset], partition_key="0..1000", resources=resources(source_dsn, target_dsn, ledger)
    )
    assert result.success
    assert pg.table_fingerprint(source_dsn, "public", "mixed") == pg.table_fingerprint(
        target_dsn, "public", "mixed"
    )
    assert pg.fetch_one(target_dsn, f"SELECT count(*) FROM {RECEIPTS}") == 4
    # One transaction per batch: its rows and its receipt were written by the same one.
    assert len(writers(target_dsn)) == 4
    assert receipt_writers(target_dsn) == writers(target_dsn)


def test_a_backfill_with_a_ledger_elsewhere_writes_its_receipts_there_apart(
    source_dsn: str, target_dsn: str, make_database: Callable[..., str]
) -> None:
    """The control: the comparison tells a ledger in the target from one elsewhere."""
    asset = tables(source_dsn, target_dsn)
    elsewhere = make_database("dpone_ledger", pg.server_admin(target_dsn))
    result = dg.materialize(
        [asset], partition_key="0..1000", resources=resources(source_dsn, target_dsn, elsewhere)
    )
    assert result.success
    assert not pg.table_exists(target_dsn, "dpone_ledger", "backfill_batch_receipts")
    assert pg.fetch_one(elsewhere, f"SELECT count(*) FROM {RECEIPTS}") == 4
    assert len(writers(target_dsn)) == 4
    assert not receipt_writers(elsewhere) & writers(target_dsn)


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_an_incremental_asset_accepts_a_ledger_naming_the_target_database(
    source_dsn: str, target_dsn: str, spelling: str
) -> None:
    pg.execute(source_dsn, ORDERS)
    insert_orders(source_dsn, 1, 2000)
    stream = Stream(source_dsn, target_dsn)
    orders = incremental_asset("shop.orders", cursor="updated_at", batch_size=700)
    ledger = spelled(target_dsn, spelling)
    result = dg.materialize([orders], resources=resources(source_dsn, target_dsn, ledger))
    assert result.success
    [check] = result.get_asset_check_evaluations()
    assert check.passed
    stream.assert_equal()
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM dpone_ledger.incremental_streams") == 1
    receipts = "dpone_ledger.incremental_batch_receipts"
    assert pg.fetch_one(target_dsn, f"SELECT count(*) FROM {receipts}") == 3
