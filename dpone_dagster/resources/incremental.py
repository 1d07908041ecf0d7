"""The incremental stream as an event iterator: ``ledger.incremental(context, source, target)``.

The asset is not partitioned: each materialization runs the stream once (continuing a run a
crash or a concurrent run left in progress, or taking a new mark), logs an ``AssetObservation``
after every committed batch, then yields the ``dpone_reconciled`` check (the final batch's
verification: every source row at or below the mark is in the target, equal) and the
materialization with the run's metadata. A run that selects the check alone copies nothing:
it compares both sides as they are (:meth:`~dpone_dagster.incremental.IncrementalSync.check`).
"""

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import dagster as dg
import psycopg
from psycopg import sql

from dpone_dagster.backfill import backfill_handoff
from dpone_dagster.catalog_metadata import source_key_of, table_catalog_metadata
from dpone_dagster.core.errors import engine_error
from dpone_dagster.failures import DponeFailure
from dpone_dagster.incremental import (
    DEFAULT_FILLFACTOR,
    BatchOutcome,
    IncrementalSync,
)
from dpone_dagster.incremental.batch import Deletes
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.metadata import (
    CHECK_NAME,
    incremental_check,
    incremental_metadata,
    log_schema_changes,
    verification_check,
)
from dpone_dagster.postgres import TableName
from dpone_dagster.postgres.connection import connect
from dpone_dagster.postgres.schema_change import SchemaChanges

if TYPE_CHECKING:
    from .postgres import BackfillLedgerResource, PostgresSourceResource, PostgresTargetResource

IncrementalEvent = dg.AssetCheckResult | dg.MaterializeResult[Any]


@dataclass(frozen=True)
class StreamOptions:
    """How the stream runs (the asset factory's options).

    Attributes:
        deletes: ``ignore``, ``hard`` or ``soft``.
        soft_delete_column: The column ``soft`` sets.
        batch_size: Rows per batch.
        lookback: Re-read this much below the mark (client clocks behind the server).
        continue_from_backfill: Start an empty stream from a complete backfill's mark.
        settle_timeout: Seconds to wait for transactions open at the mark.
        reconcile: Verify the run in its final snapshot and report ``dpone_reconciled``.
        schema_changes: ``evolve`` or ``freeze`` (see :class:`~dpone_dagster.incremental.
            IncrementalSync`).
        fillfactor: The ``fillfactor`` of a target the stream creates.
    """

    deletes: Deletes = "ignore"
    soft_delete_column: str = "_dpone_deleted_at"
    batch_size: int = 50_000
    lookback: timedelta | None = None
    continue_from_backfill: bool = False
    settle_timeout: float = 30.0
    reconcile: bool = True
    schema_changes: SchemaChanges = SchemaChanges.EVOLVE
    fillfactor: int = DEFAULT_FILLFACTOR


def _spec_names(context: dg.AssetExecutionContext) -> tuple[dg.AssetKey, TableName, TableName, str]:
    [(key, spec)] = context.assets_def.specs_by_key.items()
    names = [spec.metadata.get(k) for k in ("dpone/source_table", "dpone/table", "dpone/cursor")]
    if any(n is None for n in names):
        raise DponeFailure(
            DponeError(
                "plan_invalid",
                f"Asset {key.to_user_string()} does not name its table, target and cursor.",
                ["Build the asset with incremental_asset(...)."],
            )
        )
    source, target, cursor = (str(n) for n in names)
    return key, TableName.parse(source), TableName.parse(target), cursor


def _target_rows(dsn: str, table: TableName, soft: str | None) -> int:
    """``count(*)`` of the target's (live) rows: ``dagster/row_count``."""
    live = sql.SQL("true") if soft is None else sql.SQL("{} IS NULL").format(sql.Identifier(soft))
    with connect(dsn, side="target", autocommit=True) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE {}").format(table.ident, live)
        ).fetchone()
    return int(row[0]) if row else 0  # type: ignore[call-overload]


def _observation(key: dg.AssetKey, done: BatchOutcome) -> dg.AssetObservation:
    receipt = done.receipt
    return dg.AssetObservation(
        asset_key=key,
        metadata={
            "dpone/batch": receipt.sequence,
            "dpone/run": receipt.run,
            "dpone/rows": receipt.rows,
            "dpone/checkpoint": receipt.last.cursor if receipt.last else "",
        },
    )


def incremental_events(
    context: dg.AssetExecutionContext,
    ledger: "BackfillLedgerResource",
    source: "PostgresSourceResource",
    target: "PostgresTargetResource",
    options: StreamOptions,
) -> Iterator[IncrementalEvent]:
    """See :meth:`~dpone_dagster.BackfillLedgerResource.incremental`."""
    key, table, target_table, cursor = _spec_names(context)
    try:
        if ledger.dsn is not None:
            raise engine_error(
                "incremental_options_invalid",
                "The incremental stream keeps its state in the target database (its batches "
                "commit with their state); the ledger resource names another database.",
                ["Leave BackfillLedgerResource.dsn unset for incremental assets."],
            )
        sync = _sync(context, key, source, target, ledger, table, target_table, cursor, options)
        if key not in context.selected_asset_keys:  # the check alone: verify, copy nothing
            yield verification_check(key, sync.check(), "No run has completed yet.")
            return
        result = sync.run()
        soft = options.soft_delete_column if options.deletes == "soft" else None
        rows = _target_rows(target.dsn, target_table, soft)
    except (DponeError, psycopg.Error) as exc:
        error = exc if isinstance(exc, DponeError) else DponeError(
            "incremental_failed", str(exc), ["Run again: the stream resumes after its last batch."]
        )  # fmt: skip
        raise DponeFailure(error) from exc
    for notice in result.notices:
        context.log.warning(f"dpone: [{notice.code}] {notice.message}")
    log_schema_changes(context.log, target_table.qualified, result.schema_changes)
    if dg.AssetCheckKey(key, CHECK_NAME) in context.selected_asset_check_keys:
        yield incremental_check(key, result)
    if key in context.selected_asset_keys:
        [standard] = table_catalog_metadata(
            target.dsn,
            target.options,
            [(target_table, source_key_of(context.assets_def.specs_by_key[key]), None)],
            context.log,
            not_copied=[soft] if soft else [],
        )
        metadata = {**incremental_metadata(result, rows), **standard}
        yield dg.MaterializeResult(asset_key=key, metadata=metadata)


def _sync(
    context: dg.AssetExecutionContext,
    key: dg.AssetKey,
    source: "PostgresSourceResource",
    target: "PostgresTargetResource",
    ledger: "BackfillLedgerResource",
    table: TableName,
    target_table: TableName,
    cursor: str,
    options: StreamOptions,
) -> IncrementalSync:
    return IncrementalSync(
        source.dsn, target.dsn, table, cursor=cursor, target_table=target_table,
        deletes=options.deletes, soft_delete_column=options.soft_delete_column,
        batch_size=options.batch_size, lookback=options.lookback,
        handoff=backfill_handoff if options.continue_from_backfill else None,
        settle_timeout=options.settle_timeout, verify=options.reconcile,
        ledger_schema=ledger.schema_name, options=source.options,
        on_batch=lambda done: context.log_event(_observation(key, done)),
        schema_changes=options.schema_changes, fillfactor=options.fillfactor,
    )  # fmt: skip
