"""The code location of ``tests/dagster/test_replication_platform.py``'s `dagster dev`: a
replication group as a platform declares it (its schedule from its one cron string, its pool the
slot's name by default), and an asset of no pool that the run queue may start past a queued run.

The databases and the slot come from the environment the test gives `dagster dev`.
"""

import os

import dagster as dg

from dpone_dagster import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
    replication_assets,
)
from dpone_dagster.dagster.assets import replication_schedule

# The test names the slot; a default lets pytest's doctest collection import this file.
shop = replication_assets(
    ["shop.orders"],
    slot=os.environ.get("DPONE_QUEUE_SLOT", "dpone_queue"),
    cron_schedule="*/5 * * * *",
)


@dg.asset
def heartbeat() -> None:
    """Does nothing: a run the queue can start while the group's second run waits."""


defs = dg.Definitions(
    assets=[shop, heartbeat],
    schedules=[replication_schedule(shop)],
    jobs=[dg.define_asset_job("heartbeat_job", selection=[heartbeat])],
    resources={
        "source": PostgresSourceResource(dsn=dg.EnvVar("DPONE_SOURCE_DSN")),
        "target": PostgresTargetResource(dsn=dg.EnvVar("DPONE_TARGET_DSN")),
        "ledger": LedgerResource(),
    },
)
