"""The demo code location: `dagster dev` (via workspace.yaml) and the README's demo command load it.

Two dpone assets over the demo source that ``python -m demo.seed`` creates:

* ``shop/customers``, ``shop/orders``, ``shop/Order_Items_…``: one snapshot copy of three related
  tables (partitioned COPY, two workers): every run copies them under ONE source snapshot.
* ``events/page_views``: a daily-partitioned, ledger-backed backfill of an events table by its
  ``happened_at`` timestamp, with a schedule that fills the newest day, and the
  ``dpone_partitions_fresh`` check naming its stale partitions.
* ``shop/stock``: an incremental stream of a mutable stock table by its ``updated_at``, with hard
  deletes, a schedule every five minutes and the freshness policy it implies (the ``dpone_fresh``
  check judges it by the run's lag; ``python -m demo.stream`` shows one change, one late
  commit and one delete arriving).
* ``events/clicks``: a Kafka topic copied exactly once into ``events.clicks`` (``python -m
  demo.kafka`` starts a broker of its own and names it in ``DPONE_KAFKA_BOOTSTRAP``; unset, the
  broker is expected at 127.0.0.1:9092), bad messages kept in ``events.clicks_dead``.
* ``source/...``: the source tables, external assets upstream of their copies.

DSNs come from ``DPONE_SOURCE_DSN`` and ``DPONE_TARGET_DSN`` (passed as ``EnvVar`` when set, so a
password never shows in the UI) and default to the databases ``dpone_demo_source_<digest>`` and
``dpone_demo_target_<digest>`` of this Dagster home (``DAGSTER_HOME``, else ``.dagster_home/``;
see :func:`~dpone_dagster.embedded.demo_database`) on the local server at 127.0.0.1:5432,
or, when nothing answers there, on the embedded PostgreSQL of ``.dpone_pg/`` that the demo
started (started here if it is not running): `dagster dev` sees the demo's data either way.
"""

import os
from datetime import timedelta
from pathlib import Path

import dagster as dg
from pydantic import BaseModel

from dpone_dagster import (
    IncrementalOptions,
    KafkaCopyOptions,
    KafkaSourceResource,
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
    SnapshotCopyOptions,
    backfill_asset,
    incremental_asset,
    kafka_copy_asset,
    snapshot_copy_assets,
    source_asset_specs,
)
from dpone_dagster.dagster.assets import backfill_freshness_check
from dpone_dagster.embedded import choose_server, demo_database
from dpone_dagster.postgres.connection import Side

ROOT = Path(__file__).resolve().parent
EMBEDDED_FOLDER = ROOT / ".dpone_pg"
DAGSTER_HOME = os.environ.get("DAGSTER_HOME") or str(ROOT / ".dagster_home")


def _dsn(variable: str, side: Side) -> str:
    if os.environ.get(variable):
        return dg.EnvVar(variable)
    return choose_server(None, demo_database(side, DAGSTER_HOME), folder=EMBEDDED_FOLDER).dsn


shop = snapshot_copy_assets(
    ["shop.customers", "shop.orders", 'shop."Order Items"'],
    options=SnapshotCopyOptions(strategy="partitioned_copy", workers=2),
    name="shop_snapshot_copy",
    group_name="shop",
    pool="dpone_source",
)

page_views_days = dg.DailyPartitionsDefinition(start_date="2026-01-01", end_date="2026-02-01")

page_views = backfill_asset(
    "events.page_views",
    cursor="happened_at",
    partitions_def=page_views_days,
    batch_size=2_000,
    group_name="events",
    pool="dpone_source",
)

page_views_job = dg.define_asset_job("page_views_daily", selection=[page_views])

# The partitions older than a week, or whose source range gained rows past their mark.
page_views_fresh = backfill_freshness_check(page_views, max_age=timedelta(days=7))

EVERY_FIVE_MINUTES = "*/5 * * * *"
stock = incremental_asset(
    "shop.stock",
    cursor="updated_at",
    deletes="hard",
    batch_size=1_000,
    # The demo's open writer: wait 2 s, then go on and read again next run.
    options=IncrementalOptions(settle_timeout=2.0),
    group_name="stock",
    pool="dpone_source",
    cron_schedule=EVERY_FIVE_MINUTES,  # its freshness policy and the dpone_fresh check
)

stock_every_five_minutes = dg.ScheduleDefinition(
    name="stock_every_five_minutes", target=stock, cron_schedule=EVERY_FIVE_MINUTES
)


class Click(BaseModel):
    """A click on the demo's topic ``clicks``: its fields become the table's columns."""

    user_id: int
    page: str


clicks = kafka_copy_asset(
    key=["events", "clicks"],
    topic="clicks",
    target_table="events.clicks",
    model=Click,
    options=KafkaCopyOptions(dead_letter_table="events.clicks_dead"),
    group_name="kafka",
)


def _bootstrap() -> str:
    if os.environ.get("DPONE_KAFKA_BOOTSTRAP"):
        return dg.EnvVar("DPONE_KAFKA_BOOTSTRAP")
    return "127.0.0.1:9092"


defs = dg.Definitions(
    # The source tables, upstream of their copies in the asset graph.
    assets=[
        shop,
        page_views,
        stock,
        clicks,
        *(
            s.replace_attributes(group_name="sources")
            for s in source_asset_specs([shop, page_views, stock])
        ),
    ],
    asset_checks=[page_views_fresh],
    jobs=[page_views_job],
    schedules=[
        dg.build_schedule_from_partitioned_job(page_views_job, hour_of_day=1),
        stock_every_five_minutes,
    ],
    resources={
        "source": PostgresSourceResource(dsn=_dsn("DPONE_SOURCE_DSN", "source")),
        "target": PostgresTargetResource(dsn=_dsn("DPONE_TARGET_DSN", "target")),
        "ledger": LedgerResource(),
        "kafka": KafkaSourceResource(bootstrap_servers=_bootstrap()),
    },
)
