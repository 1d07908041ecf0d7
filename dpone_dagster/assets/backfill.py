"""``backfill_asset``: a partitioned asset that runs the ordered backfill for each partition.

Each partition is a cursor range (``cursor_range_partitions`` keys, or a Dagster time window for
a timestamp cursor) and its own durable ledger run, so a re-run, a retry or another orchestrator
resumes after the last committed batch. Within a run, partitions go in partition order and
batches in cursor order. After every committed batch the step logs an ``AssetObservation`` and
updates the run's ``dpone/checkpoint`` and ``dpone/copied`` tags, so progress shows in the UI
while the run is going. The ledger is the authority: a re-run compares the checkpoint Dagster
last recorded for a partition with the ledger's checkpoint chain, and a mismatch stops the run
(``backfill_ledger_mismatch``) instead of silently overwriting either side.
"""

# No `from __future__ import annotations`: Dagster reads the op's parameter annotations.
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg

from dpone_dagster.backfill import (
    Backfill,
    BackfillReconciliationError,
    BackfillResult,
    BackfillRun,
    BatchReceipt,
    BatchResult,
    LedgerConfig,
    prepare_target,
)
from dpone_dagster.failures import DponeFailure
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.partitions import CursorRange, PartitionError, partition_cursor_range
from dpone_dagster.postgres import TableName, check_identifier
from dpone_dagster.reconcile import Proof
from dpone_dagster.resources import (
    BackfillLedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
)
from dpone_dagster.translator import CopyTableSpec, DponeTranslator

CHECK_NAME = "dpone_reconciled"


def _check_partitions(partitions_def: dg.PartitionsDefinition) -> None:
    """Fails at definition time when a partition cannot be read as a cursor range."""
    if isinstance(partitions_def, dg.TimeWindowPartitionsDefinition):
        return
    if not isinstance(partitions_def, dg.StaticPartitionsDefinition):
        raise PartitionError(
            "plan_invalid",
            f"backfill_asset needs cursor_range_partitions(...) or time-window partitions, "
            f"not {type(partitions_def).__name__}.",
            ["Use cursor_range_partitions(start, stop, step) or DailyPartitionsDefinition."],
        )
    for key in partitions_def.get_partition_keys():
        partition_cursor_range(partitions_def, key)


def _receipts_summary(receipts: Sequence[BatchReceipt]) -> dict[str, Any]:
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


def _partition_metadata(result: BackfillResult, receipts: Sequence[BatchReceipt]) -> dict[str, Any]:
    run = result.run
    progress = run.progress
    first = receipts[0].observation.extraction if receipts else None
    last = receipts[-1].observation.extraction if receipts else None
    tokens = sorted({r.observation.extraction.source_token or "" for r in receipts} - {""})
    metadata: dict[str, Any] = {
        "dagster/row_count": progress.copied_count + progress.duplicate_count,
        "dpone/run_id": run.run_id,
        "dpone/checkpoint": progress.checkpoint or "",
        "dpone/high_water_mark": progress.source_high_water_mark or "",
        "dpone/status": run.status.value,
        "dpone/batches_committed_now": result.committed,
        "dpone/batches_replayed_now": result.replayed,
        "dpone/receipts_summary": dg.MetadataValue.json(_receipts_summary(receipts)),
        "dpone/snapshot_label": run.snapshot_label.value,
        "dpone/extraction_started_at": (
            first.extraction_started_at.isoformat() if first and first.extraction_started_at else ""
        ),
        "dpone/extraction_completed_at": (
            last.extraction_completed_at.isoformat()
            if last and last.extraction_completed_at
            else ""
        ),
        "dpone/snapshot_token_digest": tokens[0] if len(tokens) == 1 else json.dumps(tokens),
    }
    if result.reconciliation is not None:
        report = result.reconciliation
        metadata["dpone/reconciliation"] = dg.MetadataValue.json(
            {
                "ok": report.ok,
                "ranges": len(report.ranges),
                "proven_by_row_versions": report.proven_by(Proof.ROW_VERSIONS),
                "content_hashed": report.proven_by(Proof.CONTENT_HASH),
                "differing": [r.sequence for r in report.differing],
            }
        )
    return metadata


def _last_recorded_checkpoint(
    context: dg.AssetExecutionContext, key: dg.AssetKey, partition: str
) -> str | None:
    """The ``dpone/checkpoint`` of the partition's latest materialization in Dagster."""
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1
    ).records
    if not records or records[0].asset_materialization is None:
        return None
    value = records[0].asset_materialization.metadata.get("dpone/checkpoint")
    text = getattr(value, "value", value)
    return str(text) if text else None


def _cross_check(
    backfill: Backfill, recorded: str | None, run: BackfillRun | None, partition: str
) -> None:
    """Dagster's last checkpoint must be a link of the ledger's chain (the ledger may be ahead)."""
    if recorded is None:
        return
    chain = {r.checkpoint for r in backfill.receipts()} if run is not None else set()
    if recorded not in chain:
        raise DponeError(
            "backfill_ledger_mismatch",
            f"Dagster recorded checkpoint {recorded} for partition {partition!r}, but the "
            f"ledger's run {backfill.run_id} has no such checkpoint: the ledger was reset, or "
            "the asset now points at another target.",
            [
                "Restore the ledger (schema dpone_ledger of the target) from backup, or",
                "if the target was rebuilt on purpose, wipe this partition's materializations "
                "in Dagster and run it again.",
            ],
        )


def backfill_asset(
    table: str,
    *,
    cursor: str,
    partitions_def: dg.PartitionsDefinition,
    batch_size: int = 50_000,
    target_table: str | None = None,
    translator: DponeTranslator | None = None,
    name: str | None = None,
    group_name: str | None = None,
    backfill_policy: dg.BackfillPolicy | None = None,
    pool: str | None = None,
    op_tags: Mapping[str, Any] | None = None,
    reconcile: bool = True,
) -> dg.AssetsDefinition:
    """A partitioned asset that backfills ``table`` range by range through the durable ledger.

    Args:
        table: The source table (``schema.table``; quote names that need it).
        cursor: The column batches are ordered by (integer, numeric, date or timestamp; with
            a unique index or the primary key starting with it).
        partitions_def: ``cursor_range_partitions(...)`` for an integer cursor, or any Dagster
            time-window partitions for a timestamp cursor.
        batch_size: Rows per batch (each batch commits with its receipt).
        target_table: The target table; the source's name by default.
        translator: Maps the table to its asset spec (key ``[schema, table]`` by default).
        name: The op's name; derived from the key by default.
        group_name: The asset group.
        backfill_policy: Defaults to ``BackfillPolicy.single_run()`` (a partition range runs in
            one run, partitions in order); ``multi_run(1)`` gives each partition its own run.
        pool: Dagster concurrency pool limiting runs that read the source.
        op_tags: Tags of the op.
        reconcile: Reconcile each partition (count and hash per batch range) once it reaches its
            mark, and report it through the ``dpone_reconciled`` asset check.

    Returns:
        The asset definition (resource keys ``source``, ``target``, ``ledger``).

    Raises:
        DponeError: at definition time, for a bad table name (``identifier_invalid``), cursor
            or partitions (``plan_invalid``).

    Examples:
        .. code-block:: python

            events = backfill_asset(
                "events.page_views",
                cursor="id",
                partitions_def=cursor_range_partitions(0, 200_000, 50_000),
            )
    """
    spec_in = CopyTableSpec(source=table, target=target_table)
    check_identifier(cursor, what="cursor column")
    _check_partitions(partitions_def)
    if batch_size < 1:
        raise DponeError(
            "plan_invalid",
            f"batch_size must be at least 1, not {batch_size}.",
            ["Use a batch size such as 50_000."],
        )
    spec = (translator or DponeTranslator()).get_asset_spec(spec_in)
    key = spec.key
    source_table, target_name = spec_in.source_table, spec_in.target_table
    check_specs = (
        [
            dg.AssetCheckSpec(
                CHECK_NAME,
                asset=key,
                description="Target equals source at the mark, per batch range.",
            )
        ]
        if reconcile
        else []
    )

    @dg.multi_asset(
        name=name or f"backfill_{key.to_python_identifier()}",
        specs=[
            spec.replace_attributes(
                partitions_def=partitions_def,
                metadata={**spec.metadata, "dpone/cursor": cursor},
            )
        ],
        check_specs=check_specs,
        partitions_def=partitions_def,
        backfill_policy=backfill_policy or dg.BackfillPolicy.single_run(),
        pool=pool,
        op_tags={**(op_tags or {}), "dpone/source_table": source_table.qualified},
        group_name=group_name,
    )
    def _backfill(
        context: dg.AssetExecutionContext,
        source: PostgresSourceResource,
        target: PostgresTargetResource,
        ledger: BackfillLedgerResource,
    ) -> Any:
        order = {
            k: i
            for i, k in enumerate(
                partitions_def.get_partition_keys(dynamic_partitions_store=context.instance)
            )
        }
        keys = sorted(context.partition_keys, key=lambda k: order.get(k, len(order)))
        runner = _PartitionRunner(
            context, key, source, target, ledger, source_table, target_name, cursor,
            batch_size, reconcile,
        )  # fmt: skip
        checks: list[dict[str, Any]] = []
        failed: BackfillReconciliationError | None = None
        for partition in keys:
            rng = partition_cursor_range(partitions_def, partition)
            context.log.info(
                f"dpone: partition {partition}: {cursor} in ({rng.lower}, {rng.upper}]"
            )
            try:
                checks.append(runner.run(partition, rng))
            except BackfillReconciliationError as exc:
                # Report the failed check, then fail the step: a partition whose target
                # differs from its source at the mark is never reported as materialized.
                differing = [r.sequence for r in exc.report.differing]
                checks.append(
                    {"partition": partition, "ok": False, "code": exc.code, "differing": differing}
                )
                failed = exc
                break
            except DponeError as exc:
                raise DponeFailure(exc) from exc
        if reconcile:
            yield dg.AssetCheckResult(
                asset_key=key,
                check_name=CHECK_NAME,
                passed=failed is None,
                metadata={"dpone/partitions": dg.MetadataValue.json(checks)},
            )
        if failed is not None:
            raise DponeFailure(failed)
        yield dg.MaterializeResult(asset_key=key)

    return _backfill


@dataclass(frozen=True)
class _PartitionRunner:
    """What one step needs to run its partitions, one after another."""

    context: dg.AssetExecutionContext
    key: dg.AssetKey
    source: PostgresSourceResource
    target: PostgresTargetResource
    ledger: BackfillLedgerResource
    source_table: TableName
    target_table: TableName
    cursor: str
    batch_size: int
    reconcile: bool

    def observe(self, partition: str, batch: BatchResult) -> None:
        """Shows a committed batch in the UI: an observation and the run's progress tags."""
        progress = batch.run.progress
        self.context.log_event(
            dg.AssetObservation(
                asset_key=self.key,
                partition=partition,
                metadata={
                    "dpone/checkpoint": progress.checkpoint or "",
                    "dpone/copied": progress.copied_count,
                    "dpone/high_water_mark": progress.source_high_water_mark or "",
                    "dpone/remaining_estimate": progress.remaining_estimate,
                    "dpone/batch": batch.receipt.sequence,
                    "dpone/replayed": batch.replayed,
                },
            )
        )
        self.context.instance.add_run_tags(
            self.context.run.run_id,
            {
                "dpone/partition": partition,
                "dpone/checkpoint": progress.checkpoint or "",
                "dpone/copied": str(progress.copied_count),
            },
        )

    def run(self, partition: str, rng: CursorRange) -> dict[str, Any]:
        """Runs one partition's backfill to its mark; returns its check summary."""
        if prepare_target(
            self.source.dsn, self.target.dsn, self.source_table, self.target_table, self.cursor,
            options=self.source.options,
        ):  # fmt: skip
            self.context.log.info(f"dpone: created target table {self.target_table}")
        with Backfill(
            self.source.dsn,
            self.target.dsn,
            self.source_table,
            cursor=self.cursor,
            target_table=self.target_table,
            ledger=LedgerConfig(dsn=self.ledger.dsn, schema=self.ledger.schema_name),
            batch_size=self.batch_size,
            lower=rng.lower,
            upper=rng.upper,
            options=self.source.options,
        ) as backfill:
            recorded = _last_recorded_checkpoint(self.context, self.key, partition)
            _cross_check(backfill, recorded, backfill.load(), partition)
            result = backfill.run(
                on_batch=lambda batch: self.observe(partition, batch), reconcile=self.reconcile
            )
            receipts = backfill.receipts()
        self.context.add_asset_metadata(
            _partition_metadata(result, receipts), asset_key=self.key, partition_key=partition
        )
        report = result.reconciliation
        return {
            "partition": partition,
            "ok": report is None or report.ok,
            "ranges": 0 if report is None else len(report.ranges),
            "proven_by_row_versions": (
                0 if report is None else report.proven_by(Proof.ROW_VERSIONS)
            ),
            "snapshot_label": result.run.snapshot_label.value,
        }
