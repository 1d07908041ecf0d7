"""dpone-dagster: PostgreSQL snapshot copies, crash-safe ordered backfills, incremental sync and
replication from the WAL for Dagster.

The names here are what a Dagster user needs: the resources (whose event iterators copy,
backfill and stream), the asset factories and their jobs' options objects, the partitions, the
translator, the component and the failure type, from the Dagster layer
:mod:`dpone_dagster.dagster` (the options from their jobs' packages). The domain APIs live in
their subpackages and run without Dagster:
:mod:`dpone_dagster.snapshot_copy` (snapshot copies), :mod:`dpone_dagster.backfill` (the
ordered backfill), :mod:`dpone_dagster.incremental` (incremental streams),
:mod:`dpone_dagster.replication` (replication from the WAL),
:mod:`dpone_dagster.reconcile` (the reconciliation), :mod:`dpone_dagster.sources`
(MySQL/MariaDB, REST and Kafka), :mod:`dpone_dagster.postgres` (the PostgreSQL toolkit they
all stand on), :mod:`dpone_dagster.lifecycle` (receipts and terminal outcomes). The names
below are imported on first use, so that ``import dpone_dagster.postgres`` (or any other domain
package) never loads Dagster.
"""

from typing import TYPE_CHECKING

from dpone_dagster.lazy_names import lazy_names

if TYPE_CHECKING:
    from dpone_dagster.backfill import BackfillOptions
    from dpone_dagster.dagster.assets import (
        backfill_asset,
        incremental_asset,
        kafka_copy_asset,
        mysql_copy_asset,
        replication_assets,
        rest_copy_asset,
        snapshot_copy_assets,
    )
    from dpone_dagster.dagster.components import PostgresCopyComponent
    from dpone_dagster.dagster.failures import DponeFailure
    from dpone_dagster.dagster.jobs import build_extraction_job, drop_replication_job
    from dpone_dagster.dagster.partitions import cursor_range_partitions
    from dpone_dagster.dagster.resources import (
        KafkaSourceResource,
        LedgerResource,
        MySQLSourceResource,
        PostgresSourceResource,
        PostgresTargetResource,
        RestSourceResource,
    )
    from dpone_dagster.dagster.translator import CopyTableSpec, DponeTranslator, source_asset_specs
    from dpone_dagster.incremental import IncrementalOptions
    from dpone_dagster.replication import ReplicationOptions
    from dpone_dagster.snapshot_copy import SnapshotCopyOptions
    from dpone_dagster.sources import KafkaCopyOptions, MySQLRead, RestRead, SourceCopyOptions

_LAZY: dict[str, str] = {
    "BackfillOptions": "dpone_dagster.backfill",
    "CopyTableSpec": "dpone_dagster.dagster.translator",
    "DponeFailure": "dpone_dagster.dagster.failures",
    "DponeTranslator": "dpone_dagster.dagster.translator",
    "IncrementalOptions": "dpone_dagster.incremental",
    "KafkaCopyOptions": "dpone_dagster.sources",
    "KafkaSourceResource": "dpone_dagster.dagster.resources",
    "LedgerResource": "dpone_dagster.dagster.resources",
    "MySQLRead": "dpone_dagster.sources",
    "MySQLSourceResource": "dpone_dagster.dagster.resources",
    "PostgresCopyComponent": "dpone_dagster.dagster.components",
    "PostgresSourceResource": "dpone_dagster.dagster.resources",
    "PostgresTargetResource": "dpone_dagster.dagster.resources",
    "ReplicationOptions": "dpone_dagster.replication",
    "RestRead": "dpone_dagster.sources",
    "RestSourceResource": "dpone_dagster.dagster.resources",
    "SnapshotCopyOptions": "dpone_dagster.snapshot_copy",
    "SourceCopyOptions": "dpone_dagster.sources",
    "backfill_asset": "dpone_dagster.dagster.assets",
    "build_extraction_job": "dpone_dagster.dagster.jobs",
    "cursor_range_partitions": "dpone_dagster.dagster.partitions",
    "drop_replication_job": "dpone_dagster.dagster.jobs",
    "incremental_asset": "dpone_dagster.dagster.assets",
    "kafka_copy_asset": "dpone_dagster.dagster.assets",
    "mysql_copy_asset": "dpone_dagster.dagster.assets",
    "replication_assets": "dpone_dagster.dagster.assets",
    "rest_copy_asset": "dpone_dagster.dagster.assets",
    "snapshot_copy_assets": "dpone_dagster.dagster.assets",
    "source_asset_specs": "dpone_dagster.dagster.translator",
}

__version__ = "0.1.0"

__all__ = [
    "BackfillOptions",
    "CopyTableSpec",
    "DponeFailure",
    "DponeTranslator",
    "IncrementalOptions",
    "KafkaCopyOptions",
    "KafkaSourceResource",
    "LedgerResource",
    "MySQLRead",
    "MySQLSourceResource",
    "PostgresCopyComponent",
    "PostgresSourceResource",
    "PostgresTargetResource",
    "ReplicationOptions",
    "RestRead",
    "RestSourceResource",
    "SnapshotCopyOptions",
    "SourceCopyOptions",
    "__version__",
    "backfill_asset",
    "build_extraction_job",
    "cursor_range_partitions",
    "drop_replication_job",
    "incremental_asset",
    "kafka_copy_asset",
    "mysql_copy_asset",
    "replication_assets",
    "rest_copy_asset",
    "snapshot_copy_assets",
    "source_asset_specs",
]


__getattr__, __dir__ = lazy_names(__name__, _LAZY)
