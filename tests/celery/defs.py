"""The code location that the Celery run plane test and ``bench/scale_out.py`` serve.

One partitioned backfill (``public.events`` by ``id``), one run per partition, in the
``dpone_source`` pool, on the in-process executor (Dagster's default multiprocess executor cannot
start child processes inside a Celery prefork worker). Everything that differs between the test
and the benchmark comes from the environment, which the webserver, the daemon and every worker
get alike (a worker loads this file itself, by its absolute path):

* ``DPONE_SOURCE_DSN``, ``DPONE_TARGET_DSN``: the databases;
* ``DPONE_APPLICATION_NAME``: the ``application_name`` of every dpone session, set per worker so
  that ``pg_stat_activity`` shows which worker reads the source;
* ``DPONE_TABLE`` (``public.events``), ``DPONE_PARTITIONS``, ``DPONE_PARTITION_WIDTH``,
  ``DPONE_BATCH_SIZE``: the table (cursor ``id``), its partitions
  (``cursor_range_partitions(0, PARTITIONS * WIDTH, WIDTH)``) and the rows per batch.
"""

import os

import dagster as dg

from dpone_dagster import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
    backfill_asset,
    cursor_range_partitions,
)

POOL = "dpone_source"
PARTITIONS = int(os.environ.get("DPONE_PARTITIONS", "12"))
WIDTH = int(os.environ.get("DPONE_PARTITION_WIDTH", "10000"))
BATCH_SIZE = int(os.environ.get("DPONE_BATCH_SIZE", "1000"))

events = backfill_asset(
    os.environ.get("DPONE_TABLE", "public.events"),
    cursor="id",
    partitions_def=cursor_range_partitions(0, PARTITIONS * WIDTH, WIDTH),
    batch_size=BATCH_SIZE,
    group_name="celery",
    pool=POOL,
    backfill_policy=dg.BackfillPolicy.multi_run(1),
)

defs = dg.Definitions(
    assets=[events],
    executor=dg.in_process_executor,
    resources={
        "source": PostgresSourceResource(
            dsn=dg.EnvVar("DPONE_SOURCE_DSN"),
            application_name=dg.EnvVar("DPONE_APPLICATION_NAME"),
        ),
        "target": PostgresTargetResource(
            dsn=dg.EnvVar("DPONE_TARGET_DSN"),
            application_name=dg.EnvVar("DPONE_APPLICATION_NAME"),
        ),
        "ledger": LedgerResource(),
    },
)
