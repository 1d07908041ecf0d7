"""Materialization and check metadata: receipts in Dagster's vocabulary.

Standard keys where Dagster has one (``dagster/row_count``, ``dagster/table_name``,
``dagster/column_schema``, ``dagster/column_lineage``), dpone's own under ``dpone/``, each
declared once in :class:`~dpone_dagster.dagster.metadata.sets.DponeMetadataSet` and built
through it; figures that vary run over run (rows, bytes, seconds, rows per second, lag,
remaining) are numbers, so the UI plots them. The standard table set, read from the target's
catalog, is :mod:`dpone_dagster.dagster.metadata.catalog`'s.
"""

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import dagster as dg

# TableMetadataSet has no top-level name in dagster 1.13 (see .catalog).
from dagster._core.definitions.metadata import TableMetadataSet

from dpone_dagster.backfill import (
    BackfillResult,
    BatchReceipt,
    BatchResult,
    ReconciliationReport,
)
from dpone_dagster.incremental import IncrementalResult, Verification
from dpone_dagster.lifecycle import ExtractionLifecycleReceipt
from dpone_dagster.postgres import CopyReport, TableCopyReport, TargetTypes
from dpone_dagster.postgres.schema_change import ColumnChange
from dpone_dagster.reconcile import Proof, TableReconciliation

from .sets import DponeMetadataSet

CHECK_NAME = "dpone_reconciled"
"""The asset check every dpone asset declares: the target holds what the source held."""


def short_digest(digest: str) -> str:
    """A digest short enough for a tag's column: ``sha256:`` and its first 12 hex digits.

    Examples:
        >>> short_digest("sha256:" + "ab" * 32)
        'sha256:abababababab'
    """
    kind, sep, hexits = digest.partition(":")
    return f"{kind}:{hexits[:12]}" if sep else digest[:12]


def receipt_metadata(receipt: ExtractionLifecycleReceipt | None) -> dict[str, Any]:
    """The extraction window, its clock and the snapshot token digest of one receipt."""
    if receipt is None:
        return {}
    started, completed = receipt.extraction_started_at, receipt.extraction_completed_at
    return dict(
        DponeMetadataSet(
            extraction_started_at=started.isoformat() if started else None,
            extraction_completed_at=completed.isoformat() if completed else None,
            clock_authority=receipt.clock_authority,
            snapshot_authority=receipt.snapshot_authority,
            snapshot_token_digest=receipt.source_token,
            extraction_receipt=dg.MetadataValue.json(receipt.model_dump(mode="json")),
        )
    )


def rate_metadata(
    rows: int, byte_count: int | None, started: datetime | None, completed: datetime | None
) -> dict[str, Any]:
    """Bytes, extraction seconds, rows per second and lag, as numbers.

    ``dpone/lag_seconds`` is how old the source state the target now holds is: the seconds from
    the start of the source read to this report.
    """
    if started is None or completed is None:
        return dict(DponeMetadataSet(bytes=byte_count or 0))
    seconds = (completed - started).total_seconds()
    return dict(
        DponeMetadataSet(
            bytes=byte_count or 0,
            extraction_seconds=seconds,
            rows_per_second=round(rows / seconds) if seconds else 0,
            lag_seconds=(datetime.now(UTC) - started).total_seconds(),
        )
    )


def step_seconds_metadata(seconds: dict[str, float]) -> dict[str, Any]:
    """``dpone/seconds_<step>`` for each timed step of a copy (plan, extract, load)."""
    return dict(
        DponeMetadataSet(
            seconds_plan=seconds.get("plan"),
            seconds_extract=seconds.get("extract"),
            seconds_load=seconds.get("load"),
        )
    )


def table_metadata(report: CopyReport, table: TableCopyReport) -> dict[str, Any]:
    """Everything a copied table's materialization says about how it was copied."""
    sink = table.sink_result
    terminal = table.terminal_receipt
    metadata: dict[str, Any] = {
        **TableMetadataSet(row_count=table.rows_loaded or 0),
        **DponeMetadataSet(
            strategy=report.strategy.value,
            sink=report.sink.value,
            terminal_outcome=report.outcome.value,
            snapshot_label=report.snapshot_label.value,
            copy_format=table.copy_format,
            copy_format_reason=table.copy_format_reason,
            source_table=table.source.qualified,
            table=table.target.qualified,
            rows_loaded=table.rows_loaded or 0,
            sink_method=None if sink is None else sink.method,
            rows_inserted=None if sink is None else sink.rows_inserted,
            rows_updated=None if sink is None else sink.rows_updated,
            terminal_receipt=None
            if terminal is None
            else dg.MetadataValue.json(terminal.model_dump(mode="json")),
        ),
    }
    metadata.update(receipt_metadata(table.extraction_receipt))
    receipt = table.extraction_receipt
    if receipt is not None:
        metadata.update(
            rate_metadata(
                table.rows_loaded or 0,
                receipt.byte_count,
                receipt.extraction_started_at,
                receipt.extraction_completed_at,
            )
        )
    metadata.update(schema_change_metadata(table.schema_changes))
    metadata.update(created_metadata(table.target_types, table.virtual_as_stored))
    return metadata


def created_metadata(created: TargetTypes, virtual_as_stored: Sequence[str]) -> dict[str, Any]:
    """What a load created in its target for a table beyond its rows: ``dpone/types_created``,
    ``dpone/enum_labels_added``, ``dpone/extensions_created`` and ``dpone/virtual_as_stored``,
    each only when there is something to list."""
    types = [
        {"type": t.qualified, "kind": t.kind, "definition": t.describe()} for t in created.types
    ]
    labels = [
        {"type": ".".join(label.type), "label": label.label, "before": label.before}
        for label in created.labels
    ]
    extensions = [
        {"extension": e.name, "version": e.version, "schema": e.schema,
         "source_version": e.source_version}
        for e in created.extensions
    ]  # fmt: skip
    stored = [{"column": c, "source": "VIRTUAL", "target": "STORED"} for c in virtual_as_stored]

    def listed(entries: list[dict[str, Any]]) -> dg.JsonMetadataValue | None:
        return dg.MetadataValue.json(entries) if entries else None

    return dict(
        DponeMetadataSet(
            types_created=listed(types),
            enum_labels_added=listed(labels),
            extensions_created=listed(extensions),
            virtual_as_stored=listed(stored),
        )
    )


def schema_change_metadata(changes: Sequence[ColumnChange]) -> dict[str, Any]:
    """``dpone/schema_changes``: what a load changed in its target's schema, one entry per
    column (``column``, ``kind``: added, widened or kept, ``before``, ``after``, ``detail``);
    nothing when the schema was left as it was."""
    if not changes:
        return {}
    entries = [
        {"column": c.column, "kind": c.kind, "before": c.before, "after": c.after,
         "detail": c.detail}
        for c in changes
    ]  # fmt: skip
    return dict(DponeMetadataSet(schema_changes=dg.MetadataValue.json(entries)))


def log_schema_changes(
    log: dg.DagsterLogManager, target: str, changes: Sequence[ColumnChange]
) -> None:
    """Logs one line naming each difference of ``target``'s columns from the source's (added,
    widened, kept), or nothing when there is none."""
    if changes:
        listed = "; ".join(c.describe() for c in changes)
        log.info(f"Schema of {target} against the source: {listed}.")


def copy_check_result(key: dg.AssetKey, result: TableReconciliation) -> dg.AssetCheckResult:
    """The ``dpone_reconciled`` result of one copied table."""
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=CHECK_NAME,
        passed=result.passed,
        description=result.detail,
        metadata=dict(
            DponeMetadataSet(
                guarantee=result.guarantee.value,
                proof=result.proof.value,
                source_rows=result.source.count,
                target_rows=result.target.count,
                source_digest=result.source.hash,
                target_digest=result.target.hash,
                proved_at=_timestamp(result.proved_at),
            )
        ),
    )


def receipts_summary(receipts: Sequence[BatchReceipt]) -> dict[str, Any]:
    """What the batches of a partition add up to (first/last cursor, windows, snapshots)."""
    if not receipts:
        return {"batches": 0}
    first, last = receipts[0].observation, receipts[-1].observation
    tokens = {r.observation.extraction.source_token for r in receipts}
    return {
        "batches": len(receipts),
        "first_cursor": first.first_cursor,
        "last_cursor": last.last_cursor,
        "copied": sum(r.copied_count for r in receipts),
        "duplicates": sum(r.duplicate_count for r in receipts),
        "bytes": sum(r.observation.byte_count for r in receipts),
        "snapshots": len(tokens),
        "apply_paths": sorted({r.observation.apply_path.value for r in receipts}),
    }


def _window(receipts: Sequence[BatchReceipt]) -> dict[str, Any]:
    first = receipts[0].observation.extraction if receipts else None
    last = receipts[-1].observation.extraction if receipts else None
    started = first.extraction_started_at if first else None
    completed = last.extraction_completed_at if last else None
    tokens = sorted({r.observation.extraction.source_token or "" for r in receipts} - {""})
    return dict(
        DponeMetadataSet(
            extraction_started_at=started.isoformat() if started else None,
            extraction_completed_at=completed.isoformat() if completed else None,
            snapshot_token_digest=_digests(tokens),
        )
    )


def _digests(tokens: Sequence[str]) -> str | None:
    """One snapshot token's digest, a JSON list of several, or None without any."""
    if not tokens:
        return None
    return tokens[0] if len(tokens) == 1 else json.dumps(tokens)


def _partition_rates(receipts: Sequence[BatchReceipt]) -> dict[str, Any]:
    """Bytes, seconds and rows per second of this run's batches; lag from its newest batch."""
    if not receipts:
        return rate_metadata(0, 0, None, None)
    rows = sum(r.observation.copied_count + r.observation.duplicate_count for r in receipts)
    started = receipts[0].observation.extraction.extraction_started_at
    completed = receipts[-1].observation.extraction.extraction_completed_at
    metadata = rate_metadata(
        rows, sum(r.observation.byte_count for r in receipts), started, completed
    )
    newest = receipts[-1].observation.extraction.extraction_started_at
    if newest is not None:
        lag = (datetime.now(UTC) - newest).total_seconds()
        metadata.update(DponeMetadataSet(lag_seconds=lag))
    return metadata


def _reconciliation_metadata(report: ReconciliationReport) -> dict[str, Any]:
    """The reconciliation of a partition: its summary, and the rows its repairs inserted,
    updated and deleted (numbers, so the UI plots them)."""
    repaired = report.repaired_rows()
    summary = {
        "ok": report.ok,
        "ranges": len(report.ranges),
        "proven_by_row_versions": report.proven_by(Proof.ROW_VERSIONS),
        "content_hashed": report.proven_by(Proof.CONTENT_HASH),
        "differing": [r.sequence for r in report.differing],
        "proved_at": report.proved_at.isoformat(),
    }
    return dict(
        DponeMetadataSet(
            reconciliation=dg.MetadataValue.json(summary),
            reconciliation_snapshot_digest=report.source_snapshot,
            rows_repaired_inserted=repaired["inserted"],
            rows_repaired_updated=repaired["updated"],
            rows_repaired_deleted=repaired["deleted"],
        )
    )


def partition_metadata(result: BackfillResult, receipts: Sequence[BatchReceipt]) -> dict[str, Any]:
    """Everything a backfill partition's materialization says about its run.

    ``dagster/row_count`` is the rows the batches wrote (copied and found equal) or, once a
    reconciliation ran, the rows the target's ranges hold after it (repairs included).
    """
    run, progress = result.run, result.run.progress
    report = result.reconciliation
    rows = progress.copied_count + progress.duplicate_count
    if report is not None:
        rows = sum(r.target_count for r in report.ranges)
    metadata: dict[str, Any] = {
        **TableMetadataSet(row_count=rows),
        **DponeMetadataSet(
            run_id=run.run_id,
            checkpoint=progress.checkpoint,
            high_water_mark=progress.source_high_water_mark,
            status=run.status.value,
            batches_committed_now=result.committed,
            batches_replayed_now=result.replayed,
            receipts_summary=dg.MetadataValue.json(receipts_summary(receipts)),
            snapshot_label=run.snapshot_label.value,
            remaining_estimate=progress.remaining_estimate,
            batches=progress.batch_count,
        ),
        **_window(receipts),
        **_partition_rates(receipts),
    }
    if report is not None:
        metadata.update(_reconciliation_metadata(report))
    return metadata


def batch_observation(key: dg.AssetKey, partition: str, batch: BatchResult) -> dg.AssetObservation:
    """A committed batch, as the UI shows it while the partition runs (``dpone/progress_*``
    keys, plotted apart from the partition's materialization)."""
    progress = batch.run.progress
    return dg.AssetObservation(
        asset_key=key,
        partition=partition,
        metadata=dict(
            DponeMetadataSet(
                progress_checkpoint=progress.checkpoint,
                progress_copied=progress.copied_count,
                progress_high_water_mark=progress.source_high_water_mark,
                progress_remaining=progress.remaining_estimate,
                progress_batch=batch.receipt.sequence,
                progress_replayed=batch.replayed,
            )
        ),
    )


def backfill_check(
    key: dg.AssetKey, checks: Sequence[dict[str, Any]], passed: bool
) -> dg.AssetCheckResult:
    """The ``dpone_reconciled`` result of a backfill's run: a one-line summary as its
    description, the partitions checked and differing and the ranges proven as numbers (so the
    UI plots them), and each partition's summary under ``dpone/partitions``."""
    differing = [str(c["partition"]) for c in checks if not c["ok"]]
    ranges = sum(int(c.get("ranges") or 0) for c in checks)
    if differing:
        summary = (
            f"{len(differing)} of {len(checks)} partition(s) differ from the source at their "
            f"mark: {', '.join(differing)}."
        )
    else:
        summary = (
            f"{len(checks)} partition(s) checked: the target holds what the source held at "
            f"each mark ({ranges} checkpoint range(s) proven)."
        )
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=CHECK_NAME,
        passed=passed,
        description=summary,
        metadata=dict(
            DponeMetadataSet(
                partitions_checked=len(checks),
                partitions_differing=len(differing),
                ranges_proven=ranges,
                partitions=dg.MetadataValue.json(list(checks)),
            )
        ),
    )


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


def incremental_metadata(result: IncrementalResult, target_rows: int) -> dict[str, Any]:
    """Everything an incremental run's materialization says (counts and the lag as numbers)."""
    tokens = sorted({t for t in result.snapshot_tokens if t})
    notices = [{"code": n.code, "message": n.message} for n in result.notices]
    metadata: dict[str, Any] = {
        **TableMetadataSet(row_count=target_rows),
        **DponeMetadataSet(
            stream_id=result.stream_id,
            run=result.run or 0,
            rows_read=result.rows,
            rows_inserted=result.inserted,
            rows_updated=result.updated,
            rows_deleted=result.deleted,
            old_mark=result.old_mark,
            new_mark=result.new_mark,
            batches=result.batches,
            batches_committed_now=result.batches_here,
            resumed=result.resumed,
            keys_compared=result.keys_compared,
            snapshot_label=result.snapshot_label.value,
            snapshot_token_digest=_digests(tokens),
            receipts_summary=dg.MetadataValue.json(_stream_summary(result)),
            lag_seconds=(
                None if result.as_of is None else (datetime.now(UTC) - result.as_of).total_seconds()
            ),
            cursor_lag_seconds=result.lag_seconds,
            notices=dg.MetadataValue.json(notices) if notices else None,
        ),
    }
    metadata.update(schema_change_metadata(result.schema_changes))
    metadata.update(created_metadata(result.target_types, result.virtual_as_stored))
    return metadata


def incremental_check(key: dg.AssetKey, result: IncrementalResult) -> dg.AssetCheckResult:
    """The ``dpone_reconciled`` result of an incremental run: its final batch's verification.

    A run with nothing to verify (no batch: nothing changed and no deletes or verification
    asked for) passes with ``dpone/verified`` false.
    """
    nothing = "Nothing ran this time; the previous run's check stands."
    return verification_check(key, result.verification, nothing)


def verification_check(
    key: dg.AssetKey, check: Verification | None, nothing: str
) -> dg.AssetCheckResult:
    """The ``dpone_reconciled`` result of a verification (``None``: nothing was verified, the
    check passes with ``dpone/verified`` false and ``nothing`` as its description)."""
    if check is None:
        return dg.AssetCheckResult(
            asset_key=key, check_name=CHECK_NAME, passed=True, description=nothing,
            metadata=dict(DponeMetadataSet(verified=False)),
        )  # fmt: skip
    guarantee, scope = "equal_at_or_below_mark", {}
    description = "Every source row at or below the mark is in the target, equal"
    later = dict(DponeMetadataSet(changed_since_mark=check.changed_since_mark))
    if check.applied_lsn is not None:  # a replicated table: proved at the applied position
        guarantee = "equal_at_applied_lsn"
        description = f"Every source row is in the target, equal, as of {check.applied_lsn}"
        later = dict(DponeMetadataSet(applied_lsn=check.applied_lsn,
                                      changed_after_applied=check.changed_since_mark))  # fmt: skip
    if check.scope == "run":
        guarantee = stream_guarantee(check)
        description = f"{guarantee}: every key of the run, and {check.ranges_checked} of " \
            f"{check.ranges_total} key range(s) of the sweep, are in the target, equal"  # fmt: skip
        scope = dict(
            DponeMetadataSet(
                keys_checked=check.keys_checked, ranges_checked=check.ranges_checked,
                ranges_total=check.ranges_total, rows_swept=check.rows_swept,
                sweep_started_at=_iso(check.sweep_started_at), swept_at=_iso(check.swept_at),
            )
        )  # fmt: skip
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=CHECK_NAME,
        passed=check.ok,
        description=description + _verdict_words(check),
        metadata=dict(
            DponeMetadataSet(
                verified=True,
                guarantee=guarantee,
                check_scope=check.scope,
                proved_at=_timestamp(check.proved_at),
                keys_compared=check.keys_compared,
                ranges_differing=check.ranges_differing,
                deleted_kept=check.deleted_kept,
                unexplained=check.unexplained,
                examples=dg.MetadataValue.json([list(k) for k in check.examples]),
                differing_ranges=_ranges(check.differing_ranges),
                repaired_keys=check.repaired_keys or None,
                repaired_rows=check.repaired_rows or None,
                repaired_ranges=_ranges(check.repaired_ranges),
            )
        )
        | later
        | scope,
    )


def _verdict_words(check: Verification) -> str:
    left = ""
    if check.applied_lsn is not None and check.changed_since_mark:
        left = f"; {check.changed_since_mark} key(s) changed after the applied position: left " \
            "to the next run"  # fmt: skip
    if not check.ok:
        return f": {check.unexplained} row(s) are not{left}."
    if check.repaired_keys:
        return f" ({check.repaired_keys} key(s) that differed were repaired from the source)."
    return f"{left}."


KeyRanges = tuple[tuple[tuple[str, ...] | None, tuple[str, ...] | None], ...]


def _ranges(ranges: KeyRanges) -> dg.JsonMetadataValue | None:
    """Key ranges ``(after, through]`` as JSON (left out when there are none)."""
    if not ranges:
        return None
    return dg.MetadataValue.json(
        [{"after": None if a is None else list(a), "through": None if b is None else list(b)}
         for a, b in ranges]
    )  # fmt: skip


def _timestamp(at: datetime | None) -> dg.TimestampMetadataValue | None:
    return None if at is None else dg.MetadataValue.timestamp(at)


def _iso(at: datetime | None) -> str:
    return "" if at is None else at.isoformat()


def stream_guarantee(check: Verification) -> str:
    """The label of a ``run`` check's guarantee: ``this run exact; table swept at <when the
    last full sweep completed>`` (``...; table not yet swept (since <when the sweep began>)``
    before the first full sweep)."""
    if check.swept_at is not None:
        return f"this run exact; table swept at {check.swept_at.isoformat()}"
    since = check.sweep_started_at or check.proved_at
    return "this run exact; table not yet swept" + (
        "" if since is None else f" (sweep begun at {since.isoformat()})"
    )
