"""Materialization and check metadata: receipts in Dagster's vocabulary, one module per kind of
run, every name importable from here.

Standard keys where Dagster has one (``dagster/row_count``, ``dagster/table_name``,
``dagster/column_schema``, ``dagster/column_lineage``), dpone's own under ``dpone/``, each
declared once in :class:`~dpone_dagster.dagster.metadata.sets.DponeMetadataSet` and built
through it; figures that vary run over run (rows, bytes, seconds, rows per second, lag,
remaining) are numbers, so the UI plots them. The parts every kind is built of are
:mod:`.parts`'s; a snapshot copy's are :mod:`.snapshot_copy`'s, a backfill's :mod:`.backfill`'s,
an incremental stream's :mod:`.incremental`'s (a replication group's: :mod:`.replication`). The
standard table set, read from the target's catalog, is :mod:`.catalog`'s.
"""

from .backfill import backfill_check, batch_observation, partition_metadata, receipts_summary
from .incremental import (
    KeyRanges,
    incremental_check,
    incremental_metadata,
    stream_guarantee,
    verification_check,
)
from .parts import (
    CHECK_NAME,
    created_metadata,
    log_schema_changes,
    progress_observation,
    rate_metadata,
    receipt_metadata,
    schema_change_metadata,
    short_digest,
    snapshot_digests,
    timestamp_value,
)
from .snapshot_copy import copy_check_result, step_seconds_metadata, table_metadata

__all__ = [
    "CHECK_NAME",
    "KeyRanges",
    "backfill_check",
    "batch_observation",
    "copy_check_result",
    "created_metadata",
    "incremental_check",
    "incremental_metadata",
    "log_schema_changes",
    "partition_metadata",
    "progress_observation",
    "rate_metadata",
    "receipt_metadata",
    "receipts_summary",
    "schema_change_metadata",
    "short_digest",
    "snapshot_digests",
    "step_seconds_metadata",
    "stream_guarantee",
    "table_metadata",
    "timestamp_value",
    "verification_check",
]
