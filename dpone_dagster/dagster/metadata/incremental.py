"""An incremental stream's metadata: a run's materialization (its counts, marks and lag as
numbers) and the ``dpone_reconciled`` result of its verification (:mod:`.stream_check`), built
through the stream's set
(:class:`~dpone_dagster.dagster.metadata.keys.incremental.IncrementalMetadataSet`), the stream
check's (``dpone/keys_compared``) and the common one."""

from datetime import UTC, datetime
from typing import Any

import dagster as dg

# TableMetadataSet has no public name in dagster 1.13 (see .catalog).
from dagster._core.definitions.metadata import TableMetadataSet

from dpone_dagster.incremental import IncrementalResult

from .keys.common import CommonMetadataSet
from .keys.incremental import IncrementalMetadataSet
from .keys.stream_check import StreamCheckMetadataSet
from .parts import created_metadata, schema_change_metadata, snapshot_digests
from .stream_check import verification_check


def _stream_summary(result: IncrementalResult) -> dict[str, Any]:
    """What the run's batch receipts add up to."""
    receipts = result.receipts
    if not receipts:
        return {"batches": 0}
    first, last = receipts[0], receipts[-1]
    started = first.extraction.extraction_started_at
    completed = last.extraction.extraction_completed_at
    return {
        "batches": len(receipts),
        "first_sequence": first.sequence,
        "last_sequence": last.sequence,
        "after_cursor": first.after.cursor if first.after else None,
        "last_cursor": last.last.cursor if last.last else None,
        "snapshots": len({r.extraction.source_token for r in receipts}),
        "extraction_started_at": started.isoformat() if started else None,
        "extraction_completed_at": completed.isoformat() if completed else None,
    }


def incremental_metadata(result: IncrementalResult) -> dict[str, Any]:
    """Everything an incremental run's materialization says (counts and the lag as numbers;
    ``dagster/row_count`` the target's live rows as the ledger keeps them, when known)."""
    tokens = sorted({t for t in result.snapshot_tokens if t})
    notices = [{"code": n.code, "message": n.message} for n in result.notices]
    metadata: dict[str, Any] = {
        **TableMetadataSet(row_count=result.target_rows),
        **CommonMetadataSet(
            stream_id=result.stream_id,
            run=result.run or 0,
            rows_inserted=result.inserted,
            rows_updated=result.updated,
            rows_deleted=result.deleted,
            batches=result.batches,
            batches_committed_now=result.batches_here,
            snapshot_label=result.snapshot_label.value,
            snapshot_token_digest=snapshot_digests(tokens),
            receipts_summary=dg.MetadataValue.json(_stream_summary(result)),
            lag_seconds=(
                None if result.as_of is None else (datetime.now(UTC) - result.as_of).total_seconds()
            ),
        ),
        **IncrementalMetadataSet(
            rows_read=result.rows,
            old_mark=result.old_mark,
            new_mark=result.new_mark,
            resumed=result.resumed,
            cursor_lag_seconds=result.lag_seconds,
            notices=dg.MetadataValue.json(notices) if notices else None,
        ),
        **StreamCheckMetadataSet(keys_compared=result.keys_compared),
    }
    metadata.update(schema_change_metadata(result.schema_changes))
    metadata.update(created_metadata(result.target_types, result.virtual_as_stored))
    return metadata


def incremental_check(key: dg.AssetKey, result: IncrementalResult) -> dg.AssetCheckResult:
    """The ``dpone_reconciled`` result of an incremental run: its final batch's verification.

    A run with nothing to verify (no batch: nothing changed and no deletes or verification
    asked for) verified nothing: a warning with ``dpone/verified`` false, never a pass.
    """
    nothing = (
        "This run verified nothing: nothing changed since the last run, and no deletes or "
        "check were asked for; the last run's check stands."
    )
    return verification_check(key, result.verification, nothing)
