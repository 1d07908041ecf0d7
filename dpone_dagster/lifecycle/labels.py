"""The snapshot label: the honest answer to "did this data come from one snapshot?"."""

from __future__ import annotations

from enum import StrEnum


class SnapshotLabel(StrEnum):
    """What one materialization (a snapshot copy, a backfill partition, a generic load) can say
    about the snapshots its rows were read under."""

    SINGLE_SNAPSHOT = "single_snapshot"
    """Every row was read under one source snapshot (its token digest is reported)."""
    SEVERAL_SNAPSHOTS = "several_snapshots"
    """The rows were read under several snapshots (a backfill's batches) and not yet reconciled."""
    SEVERAL_SNAPSHOTS_RECONCILED = "several_snapshots_reconciled"
    """Several batch snapshots, then a reconciliation under ONE source snapshot found every
    range of the target equal to the source at the boundary."""
    REPAIRED_TO_ONE_SNAPSHOT = "repaired_to_one_snapshot"
    """The rows were read under batch snapshots, then the source changed or deleted rows already
    copied, and a reconciliation rewrote those ranges from ONE later source snapshot (its digest
    is reported): the target equals the source at that snapshot, not at the high-water mark's.
    Only a backfill run with ``on_changed="repair"`` says this."""
    NO_SNAPSHOT_CLAIM = "no_snapshot_claim"
    """No snapshot can be claimed: the source gave no snapshot evidence (a generic source)."""
    NO_ROWS_COPIED = "no_rows_copied"
    """Nothing was copied yet, so there is nothing to claim."""
