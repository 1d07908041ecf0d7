"""The demo's second code location: a replication group of three ``live`` tables, from the WAL.

A replication group needs a source with ``wal_level = logical``, often another server than the
demo source of ``definitions.py`` (see ``demo/live.py``: ``DPONE_DEMO_LOGICAL_DSN``, else the
demo source when it is logical, else the embedded PostgreSQL); its resource ``source`` differs,
so it is a code location of its own (``workspace.yaml`` serves both). ``python -m
demo.replication`` materializes it twice and drops its slot; ``drop_live`` drops it from the UI.
"""

import os

import dagster as dg

from demo.live import LOGICAL_ENV, TABLES, logical_source, slot_name
from demo.seed import choose
from dpone_dagster import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
    drop_replication_job,
    replication_assets,
)

live = replication_assets(TABLES, slot=slot_name(), group_name="live")


def _dsn(variable: str, default: str) -> str:
    return dg.EnvVar(variable) if os.environ.get(variable) else default


defs = dg.Definitions(
    assets=[live],
    jobs=[drop_replication_job(live, name="drop_live")],
    resources={
        "source": PostgresSourceResource(dsn=_dsn(LOGICAL_ENV, logical_source().dsn)),
        "target": PostgresTargetResource(dsn=_dsn("DPONE_TARGET_DSN", choose("target").dsn)),
        "ledger": LedgerResource(),
    },
)
