"""Your own assets around dpone's event iterators, as with dagster-sling's ``replicate``.

``source.copy_tables(context, target=target)`` and ``source.backfill(context, target=target,
ledger=ledger)`` are the bodies of dpone's own factories; here they run inside assets written by
hand, with logic of their own before and after.
"""

import dagster as dg

from dpone_dagster import (
    BackfillOptions,
    CopyTableSpec,
    DponeTranslator,
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
    cursor_range_partitions,
)
from dpone_dagster.dagster.metadata import DponeMetadataSet

translator = DponeTranslator()
orders = translator.get_asset_spec(CopyTableSpec(source="shop.orders"))


@dg.multi_asset(
    specs=[orders],
    check_specs=[dg.AssetCheckSpec("dpone_reconciled", asset=orders.key)],
    can_subset=True,
)
def shop_orders(
    context: dg.AssetExecutionContext,
    source: PostgresSourceResource,
    target: PostgresTargetResource,
):
    context.log.info("copying the orders under one snapshot")
    context.add_asset_metadata({"team": "sales"}, asset_key=orders.key)  # beside dpone's own
    yield from source.copy_tables(context, target=target, strategy="batched_copy")


days = cursor_range_partitions(0, 3_000, 1_000)
page_views = translator.get_asset_spec(CopyTableSpec(source="events.page_views"))


@dg.multi_asset(
    specs=[
        page_views.replace_attributes(partitions_def=days).merge_attributes(
            metadata=dict(DponeMetadataSet(cursor="id"))
        )
    ],
    partitions_def=days,
)
def page_views_backfill(
    context: dg.AssetExecutionContext,
    source: PostgresSourceResource,
    target: PostgresTargetResource,
    ledger: LedgerResource,
):
    options = BackfillOptions(batch_size=500)
    yield from source.backfill(context, target=target, ledger=ledger, options=options)
    context.log.info(f"partitions {context.partition_keys} are in the target")


defs = dg.Definitions(
    assets=[shop_orders, page_views_backfill],
    resources={
        "source": PostgresSourceResource(dsn=dg.EnvVar("DPONE_SOURCE_DSN")),
        "target": PostgresTargetResource(dsn=dg.EnvVar("DPONE_TARGET_DSN")),
        "ledger": LedgerResource(),
    },
)
