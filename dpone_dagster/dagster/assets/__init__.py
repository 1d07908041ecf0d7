"""Asset factories: snapshot copies (one multi-asset per snapshot), partitioned backfills (and
the check of their partitions' freshness), incremental streams, replication groups from the WAL,
and the generic sources' copies (MySQL/MariaDB, REST, Kafka)."""

from typing import TYPE_CHECKING

from dpone_dagster.lazy_names import lazy_names

if TYPE_CHECKING:
    from .backfill import backfill_asset
    from .backfill_freshness import backfill_freshness_check
    from .incremental import incremental_asset
    from .kafka import kafka_copy_asset
    from .replication import replication_assets, replication_schedule
    from .snapshot_copy import snapshot_copy_assets
    from .sources import mysql_copy_asset, rest_copy_asset

__all__ = [
    "backfill_asset",
    "backfill_freshness_check",
    "incremental_asset",
    "kafka_copy_asset",
    "mysql_copy_asset",
    "replication_assets",
    "replication_schedule",
    "rest_copy_asset",
    "snapshot_copy_assets",
]

__getattr__, __dir__ = lazy_names(
    __name__,
    {
        "backfill_asset": ".backfill",
        "backfill_freshness_check": ".backfill_freshness",
        "incremental_asset": ".incremental",
        "kafka_copy_asset": ".kafka",
        "mysql_copy_asset": ".sources",
        "replication_assets": ".replication",
        "replication_schedule": ".replication",
        "rest_copy_asset": ".sources",
        "snapshot_copy_assets": ".snapshot_copy",
    },
)
