"""Materialization and check metadata: receipts in Dagster's vocabulary, one module per kind of
run, every name importable from here (on first use: importing this module loads none of them,
so that a job's events load its own kind, not every kind's engine).

Standard keys where Dagster has one (``dagster/row_count``, ``dagster/table_name``,
``dagster/column_schema``, ``dagster/column_lineage``), dpone's own under ``dpone/``, each
declared once in its job's set (:mod:`~dpone_dagster.dagster.metadata.keys`) and built through
it; figures that vary run over run (rows, bytes, seconds, rows per second, lag, remaining) are
numbers, so the UI plots them. The parts every kind is built of are :mod:`.parts`'s; a snapshot
copy's are :mod:`.snapshot_copy`'s, a backfill's :mod:`.backfill`'s, an incremental stream's
:mod:`.incremental`'s, a stream's ``dpone_reconciled`` check :mod:`.stream_check`'s (a
replication group's: :mod:`.replication`). The standard table set, read from the target's
catalog, is :mod:`.catalog`'s.
"""

from typing import TYPE_CHECKING

from dpone_dagster.lazy_names import lazy_names

if TYPE_CHECKING:
    from .backfill import backfill_check, batch_observation, partition_metadata, receipts_summary
    from .incremental import incremental_check, incremental_metadata
    from .parts import (
        CHECK_NAME,
        created_metadata,
        log_schema_changes,
        progress_observation,
        rate_metadata,
        schema_change_metadata,
        short_digest,
        snapshot_digests,
        timestamp_value,
    )
    from .snapshot_copy import (
        copy_check_result,
        receipt_metadata,
        step_seconds_metadata,
        table_metadata,
    )
    from .stream_check import KeyRanges, stream_guarantee, verification_check

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

_HERE = "dpone_dagster.dagster.metadata."
"""The package of the modules named (this module is no package)."""

__getattr__, __dir__ = lazy_names(
    __name__,
    {
        "CHECK_NAME": _HERE + "parts",
        "KeyRanges": _HERE + "stream_check",
        "backfill_check": _HERE + "backfill",
        "batch_observation": _HERE + "backfill",
        "copy_check_result": _HERE + "snapshot_copy",
        "created_metadata": _HERE + "parts",
        "incremental_check": _HERE + "incremental",
        "incremental_metadata": _HERE + "incremental",
        "log_schema_changes": _HERE + "parts",
        "partition_metadata": _HERE + "backfill",
        "progress_observation": _HERE + "parts",
        "rate_metadata": _HERE + "parts",
        "receipt_metadata": _HERE + "snapshot_copy",
        "receipts_summary": _HERE + "backfill",
        "schema_change_metadata": _HERE + "parts",
        "short_digest": _HERE + "parts",
        "snapshot_digests": _HERE + "parts",
        "step_seconds_metadata": _HERE + "snapshot_copy",
        "stream_guarantee": _HERE + "stream_check",
        "table_metadata": _HERE + "snapshot_copy",
        "timestamp_value": _HERE + "parts",
        "verification_check": _HERE + "stream_check",
    },
)
