"""The incremental stream's events: ``source.incremental(context, target=target, ledger=ledger)``.

The asset is not partitioned: each materialization runs the stream once (continuing a run a
crash or a concurrent run left in progress, or taking a new mark), logs an ``AssetObservation``
after every committed batch, then yields the ``dpone_reconciled`` check (the final batch's
verification: by default every key the run copied and a rolling slice of the key, see
:mod:`dpone_dagster.incremental.sweep`; ``check="full"``: every source row at or below the mark
is in the target, equal) and the
materialization with the run's metadata, then, for an asset with a freshness policy, the
``dpone_fresh`` check judging the policy by the run's lag
(:func:`~dpone_dagster.dagster.metadata.freshness.stream_freshness`). A run that selects the
checks alone copies nothing: ``dpone_reconciled`` compares both sides as they are
(:meth:`~dpone_dagster.incremental.IncrementalSync.check`), ``dpone_fresh`` judges the latest
recorded lag.
"""

from collections.abc import Iterator
from dataclasses import KW_ONLY, dataclass
from typing import Any, ClassVar

import dagster as dg

from dpone_dagster.core.errors import engine_error
from dpone_dagster.core.ledger import LedgerConfig
from dpone_dagster.dagster.failures import FailureCoding
from dpone_dagster.dagster.metadata.freshness import stream_freshness
from dpone_dagster.dagster.metadata.incremental import incremental_check, incremental_metadata
from dpone_dagster.dagster.metadata.keys.batch import BatchMetadataSet
from dpone_dagster.dagster.metadata.keys.common import CommonMetadataSet
from dpone_dagster.dagster.metadata.parts import (
    CHECK_NAME,
    log_schema_changes,
    progress_observation,
)
from dpone_dagster.dagster.metadata.stream_check import verification_check
from dpone_dagster.incremental import BatchOutcome, IncrementalOptions, IncrementalSync
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres import TableName

from .databases import Database, TargetDatabase
from .skeleton import JobEvents
from .tail import materialized, table_set

IncrementalEvent = dg.AssetCheckResult | dg.MaterializeResult[Any]


def _spec_names(context: dg.AssetExecutionContext) -> tuple[dg.AssetKey, TableName, TableName, str]:
    [(key, spec)] = context.assets_def.specs_by_key.items()
    names = CommonMetadataSet.read(spec.metadata, "source_table", "table", "cursor")
    if names.source_table is None or names.table is None or names.cursor is None:
        raise DponeError(
            "plan_invalid",
            f"Asset {key.to_user_string()} does not name its table, target and cursor.",
            ["Build the asset with incremental_asset(...)."],
        )
    return key, TableName.parse(names.source_table), TableName.parse(names.table), names.cursor


def _observation(key: dg.AssetKey, done: BatchOutcome) -> dg.AssetObservation:
    receipt = done.receipt
    figures = BatchMetadataSet(
        progress_batch=receipt.sequence, progress_run=receipt.run, progress_rows=receipt.rows,
        progress_checkpoint=receipt.last.cursor if receipt.last else None,
    )  # fmt: skip
    return progress_observation(key, figures)


@dataclass(frozen=True)
class IncrementalEvents(JobEvents[IncrementalEvent]):
    """The events of one run of an asset's incremental stream: iterating them runs it.

    :meth:`~dpone_dagster.PostgresSourceResource.incremental` returns one; the attributes are
    its arguments as plain values (the resources' databases, ``ledger`` the ledger's settings,
    the default ledger's when it was not given, ``options`` the defaults when not given). The
    engine codes its own database failures; any other one is ``incremental_failed`` (or the
    kind's code).
    """

    coding: ClassVar[FailureCoding] = FailureCoding("target", outage="incremental_failed")

    context: dg.AssetExecutionContext
    _: KW_ONLY
    source: Database
    target: TargetDatabase
    ledger: LedgerConfig
    options: IncrementalOptions

    def run(self) -> Iterator[IncrementalEvent]:
        """Runs the stream once; yields the check (when selected), then the materialization
        (``plan_invalid`` for a spec that names no table, target and cursor;
        ``incremental_options_invalid`` for a ledger in another database)."""
        context, target = self.context, self.target
        key, table, target_table, cursor = _spec_names(context)
        sync = self._sync(key, table, target_table, cursor)
        soft = sync.soft  # the soft-delete column, when deletes are soft
        if key not in context.selected_asset_keys:  # the checks alone: copy nothing
            if dg.AssetCheckKey(key, CHECK_NAME) in context.selected_asset_check_keys:
                yield verification_check(key, sync.check(), "No run has completed yet.")
            yield from stream_freshness(context, key, None)
            return
        result = sync.run()
        for notice in result.notices:
            context.log.warning(f"dpone: [{notice.code}] {notice.message}")
        log_schema_changes(context.log, target_table.qualified, result.schema_changes)
        if dg.AssetCheckKey(key, CHECK_NAME) in context.selected_asset_check_keys:
            yield incremental_check(key, result)
        if key in context.selected_asset_keys:
            standard = table_set(
                context, target, key, target_table, not_copied=[soft] if soft else [],
                source=(self.source.dsn, self.source.options, [table]),
            )  # fmt: skip
            yield from materialized(context, key, {**incremental_metadata(result), **standard})

    def _sync(
        self, key: dg.AssetKey, table: TableName, target_table: TableName, cursor: str
    ) -> IncrementalSync:
        """The stream's engine, once the ledger is known to be in the target's database."""
        if not self.ledger.in_target:
            raise engine_error(
                "incremental_options_invalid",
                "The incremental stream keeps its state in the target database (its batches "
                "commit with their state); the ledger resource names another database.",
                [
                    "Leave LedgerResource.dsn unset for incremental assets, or give it the "
                    "target's host, port and database.",
                ],
            )
        return IncrementalSync(
            self.source.dsn, self.target.dsn, table, cursor=cursor, target_table=target_table,
            options=self.options,
            ledger_schema=self.ledger.schema, connection_options=self.source.options,
            target_connection_options=self.target.options,
            on_batch=lambda done: self.context.log_event(_observation(key, done)),
            create_extensions=self.target.create_extensions,
        )  # fmt: skip
