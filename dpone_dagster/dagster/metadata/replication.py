"""What a replication group's run says: each table's materialization and the
``dpone_slot_healthy`` check of the group's slot.

The slot is an operational object: a slot nobody drains keeps WAL on the source's disk until it
fills, and a slot the server invalidated (``max_slot_wal_keep_size``) has lost changes. The
check warns when the slot retains more WAL than a threshold and fails (error) when its
``wal_status`` is ``unreserved`` (the server may remove WAL it still needs at the next
checkpoint) or ``lost`` (it has).
"""

from collections.abc import Sequence
from typing import Any

import dagster as dg

from dpone_dagster.dagster.metadata.receipts import schema_change_metadata
from dpone_dagster.dagster.metadata.sets import DponeMetadataSet
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.replication.changes import lsn_text
from dpone_dagster.replication.report import ReplicationReport, TableChanges
from dpone_dagster.replication.slot import SlotStatus

SLOT_CHECK_NAME = "dpone_slot_healthy"
"""The name of the asset check on a replicated table's slot."""

DEFAULT_RETAINED_WAL_WARN_BYTES = 1 << 30
"""Retained WAL above which ``dpone_slot_healthy`` warns by default: 1 GiB."""

AT_RISK = ("unreserved", "lost")
"""The ``wal_status`` values that fail the check: WAL the slot needs is, or may be, gone."""


def slot_metadata(status: SlotStatus) -> dict[str, Any]:
    """The slot's figures as numbers (``safe_wal_size`` left out when unlimited)."""
    return dict(
        DponeMetadataSet(
            slot=status.slot,
            wal_status=status.wal_status,
            safe_wal_size=status.safe_wal_size,
            lag_bytes=status.lag_bytes,
            retained_wal_bytes=status.retained_bytes,
        )
    )


def slot_check(
    key: dg.AssetKey, slot: str, status: SlotStatus | None, warn_bytes: int
) -> dg.AssetCheckResult:
    """``dpone_slot_healthy`` of one table of the group.

    Fails with severity ``ERROR`` when the slot is missing, ``unreserved`` or ``lost``; with
    severity ``WARN`` when it retains more than ``warn_bytes`` of WAL; passes otherwise.
    """
    threshold = dict(DponeMetadataSet(retained_wal_warn_bytes=warn_bytes))
    if status is None:
        metadata = {**threshold, **DponeMetadataSet(slot=slot)}
    else:
        metadata = {**slot_metadata(status), **threshold}
    failure = _slot_failure(slot, status, warn_bytes)
    if failure is None:
        return dg.AssetCheckResult(
            asset_key=key, check_name=SLOT_CHECK_NAME, passed=True, metadata=metadata
        )
    severity, description = failure
    return dg.AssetCheckResult(
        asset_key=key, check_name=SLOT_CHECK_NAME, passed=False, severity=severity,
        description=description, metadata=metadata,
    )  # fmt: skip


def _slot_failure(
    slot: str, status: SlotStatus | None, warn_bytes: int
) -> tuple[dg.AssetCheckSeverity, str] | None:
    """Why the slot fails its check, and how badly (``None``: it passes)."""
    if status is None:
        return dg.AssetCheckSeverity.ERROR, f"Slot {slot} does not exist on the source."
    if status.wal_status in AT_RISK:
        what = "has lost WAL it needed" if status.wal_status == "lost" else "may lose WAL"
        return dg.AssetCheckSeverity.ERROR, (
            f"Slot {slot} is {status.wal_status}: it {what} "
            "(max_slot_wal_keep_size); resync the group."
        )
    retained = status.retained_bytes
    if retained > warn_bytes:
        return dg.AssetCheckSeverity.WARN, (
            f"Slot {slot} retains {retained} bytes of WAL, over {warn_bytes}: run "
            "the group more often, or drop the slot if the group is gone."
        )
    return None


def _group_changes(report: ReplicationReport, table: TableName) -> dict[str, Any]:
    """The group's changes of the run (tables joined, left, partitions merged) and the table's
    sequences, each left out when empty."""

    def listed(values: Sequence[object]) -> dg.JsonMetadataValue | None:
        return dg.JsonMetadataValue(list(values)) if values else None

    return dict(
        DponeMetadataSet(
            tables_joined=listed([t.qualified for t in report.tables_joined]),
            tables_left=listed([t.qualified for t in report.tables_removed]),
            partitions_merged=listed([t.qualified for t in report.partitions_merged]),
            sequences=listed([s.as_json() for s in report.sequences if s.table == table]),
        )
    )


def replication_metadata(
    report: ReplicationReport, table: TableChanges | None, source_table: TableName
) -> dict[str, Any]:
    """A table's materialization: its changes by kind (none when the run had none for it), the
    group's run and slot, as numbers; the group's changes and the table's sequences."""
    copies = (*([report.initial_copy] if report.initial_copy else []), *report.join_copies)
    loaded = [t.rows_loaded or 0 for c in copies for t in c.tables if t.target == source_table]
    copied = sum(loaded) if loaded else None
    metadata: dict[str, Any] = {
        **DponeMetadataSet(
            publication=report.group.publication,
            rows_inserted=table.inserted if table else 0,
            rows_updated=table.updated if table else 0,
            rows_deleted=table.deleted if table else 0,
            rows_truncated=table.truncated if table else 0,
            transactions=report.transactions,
            transactions_skipped=report.skipped_transactions,
            applied_lsn=lsn_text(report.applied_lsn),
            upto_lsn=lsn_text(report.upto_lsn),
            budget_reached=report.budget_reached,
            initial_copy=report.initial_copy is not None or source_table in report.tables_joined,
            rows_loaded=copied,
            lag_seconds=report.lag_seconds,
        ),
        **slot_metadata(report.slot),
        **_group_changes(report, source_table),
    }
    metadata.update(schema_change_metadata(table.schema_changes if table else ()))
    return metadata
