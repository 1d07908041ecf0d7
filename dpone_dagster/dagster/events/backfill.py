"""The partitioned backfill's events: ``source.backfill(context, target=target, ledger=ledger)``.

Each partition is a cursor range (``cursor_range_partitions`` keys, or a Dagster time window for
a timestamp cursor) and its own durable ledger run, so a re-run, a retry or another orchestrator
resumes after the last committed batch. Within a run, partitions go in partition order and
batches in cursor order. After every committed batch the step logs an ``AssetObservation`` and
updates the run's ``dpone/checkpoint`` and ``dpone/copied`` tags, so progress shows in the UI
while the run is going. The ledger is the authority: a re-run compares the checkpoint Dagster
last recorded for a partition with the ledger's checkpoint chain, and a mismatch stops the run
(``backfill_ledger_mismatch``) instead of silently overwriting either side.

A step that creates its target creates it without its primary key, loads every partition's
batches, builds the key, then reconciles each partition
(:mod:`dpone_dagster.backfill.deferred_key`): its rows cost no index insertion, as a snapshot
copy's do not.
"""

from collections.abc import Iterator
from dataclasses import KW_ONLY, dataclass
from functools import partial
from typing import Any

import dagster as dg

from dpone_dagster.backfill import (
    Backfill,
    BackfillOptions,
    BackfillReconciliationError,
    BackfillResult,
    BackfillStatus,
    PreparedTarget,
    prepare_target,
)
from dpone_dagster.core.ledger import LedgerConfig
from dpone_dagster.dagster.metadata.backfill import backfill_check, partition_metadata
from dpone_dagster.dagster.metadata.keys.backfill import PartitionMetadataSet
from dpone_dagster.dagster.metadata.keys.common import CommonMetadataSet
from dpone_dagster.dagster.metadata.parts import CHECK_NAME, created_metadata
from dpone_dagster.dagster.partitions import CursorRange, partition_cursor_range
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres import TableName
from dpone_dagster.reconcile import Proof

from .databases import Database, TargetDatabase
from .progress import ProgressReporter
from .skeleton import JobEvents
from .tail import table_set

BackfillEvent = dg.AssetCheckResult | dg.MaterializeResult[Any]


@dataclass(frozen=True)
class BackfillTarget:
    """What one backfill asset copies: from its spec's metadata."""

    key: dg.AssetKey
    source: TableName
    target: TableName
    cursor: str
    partitions_def: dg.PartitionsDefinition


def backfill_target(context: dg.AssetExecutionContext) -> BackfillTarget:
    """The table, target and cursor of the asset being materialized.

    Raises:
        DponeError: ``plan_invalid`` when the spec does not name them.
    """
    # Every spec of the definition, selected or not: a run may select the check alone.
    [(key, spec)] = context.assets_def.specs_by_key.items()
    names = CommonMetadataSet.read(spec.metadata, "source_table", "table", "cursor")
    if names.source_table is None or names.table is None or names.cursor is None:
        raise DponeError(
            "plan_invalid",
            f"Asset {key.to_user_string()} does not name its table, target and cursor "
            "(dpone/source_table, dpone/table, dpone/cursor).",
            ["Build the asset with backfill_asset(...), or put those keys in its spec."],
        )
    assert spec.partitions_def is not None, "a backfill asset is partitioned"
    return BackfillTarget(
        key,
        TableName.parse(names.source_table),
        TableName.parse(names.table),
        names.cursor,
        spec.partitions_def,
    )


def ordered_partitions(
    context: dg.AssetExecutionContext, partitions_def: dg.PartitionsDefinition
) -> list[str]:
    """The run's partition keys in the partitions definition's order (every partition for a
    run of the check alone, which Dagster runs without a partition)."""
    keys = partitions_def.get_partition_keys(dynamic_partitions_store=context.instance)
    if not (context.has_partition_key or context.has_partition_key_range):
        return list(keys)
    order = {k: i for i, k in enumerate(keys)}
    return sorted(context.partition_keys, key=lambda k: order.get(k, len(order)))


@dataclass(frozen=True)
class BackfillEvents(JobEvents[BackfillEvent]):
    """The events of a backfill of the run's partitions: iterating them runs it.

    :meth:`~dpone_dagster.PostgresSourceResource.backfill` returns one; the attributes are its
    arguments as plain values (the resources' databases, ``ledger`` the ledger's settings, the
    default ledger's when it was not given, ``options`` the defaults when not given).
    """

    context: dg.AssetExecutionContext
    _: KW_ONLY
    source: Database
    target: TargetDatabase
    ledger: LedgerConfig
    options: BackfillOptions

    def run(self) -> Iterator[BackfillEvent]:
        """Runs the partitions in order; yields the check (when selected), then the
        materialization; a partition whose reconciliation failed ends the run with its error,
        after the check that reports it."""
        context = self.context
        what = backfill_target(context)
        with ProgressReporter(context, what.key) as progress:
            runner = _PartitionRunner(
                context, what, self.source, self.target, self.ledger, self.options, progress
            )
            checks, failed = runner.run_all(ordered_partitions(context, what.partitions_def))
        if dg.AssetCheckKey(what.key, CHECK_NAME) in context.selected_asset_check_keys:
            passed = failed is None and all(c["ok"] for c in checks)
            yield backfill_check(what.key, checks, passed)
        if failed is not None:
            raise failed
        if what.key in context.selected_asset_keys:
            yield dg.MaterializeResult(asset_key=what.key)


@dataclass(frozen=True)
class _PartitionRunner:
    """What one step needs to run its partitions, one after another."""

    context: dg.AssetExecutionContext
    what: BackfillTarget
    source: Database
    target: TargetDatabase
    ledger: LedgerConfig
    options: BackfillOptions
    progress: ProgressReporter

    def run_all(
        self, partitions: list[str]
    ) -> tuple[list[dict[str, Any]], BackfillReconciliationError | None]:
        """Runs every partition in order; stops at the first whose reconciliation failed.

        When this step creates the target, it creates it without its primary key
        (:mod:`dpone_dagster.backfill.deferred_key`), loads every partition's batches, builds
        the key, then reconciles each partition: a row then costs no index insertion.
        """
        checks: list[dict[str, Any]] = []
        self.progress.begin(len(partitions))
        prepared = self._prepare() if self.what.key in self.context.selected_asset_keys else None
        last = self._load_keyless(partitions) if prepared and prepared.deferred_key else None
        try:
            for i, partition in enumerate(partitions):
                first = prepared if i == 0 else PreparedTarget(False)  # created: said once
                again = last if i == len(partitions) - 1 else None
                try:
                    checks.append(self.run(partition, self._range(partition), first, again))
                except BackfillReconciliationError as exc:
                    # Report the failed check, then fail the step: a partition whose target
                    # differs from its source at the mark is never reported as materialized.
                    checks.append(_failed_check(partition, exc))
                    return checks, exc
        finally:
            if last is not None:
                last.close()
        return checks, None

    def _range(self, partition: str) -> CursorRange:
        """The partition's cursor range, logged."""
        rng = partition_cursor_range(self.what.partitions_def, partition)
        self.context.log.info(
            f"dpone: partition {partition}: {self.what.cursor} in ({rng.lower}, {rng.upper}]"
        )
        return rng

    def _prepare(self) -> PreparedTarget:
        """Creates the target if it is missing (its key deferred when the ledger is in the
        target database)."""
        what = self.what
        prepared = prepare_target(
            self.source.dsn, self.target.dsn, what.source, what.target, what.cursor,
            options=self.source.options, target_options=self.target.options,
            create_extensions=self.target.create_extensions, defer_key=self.ledger.in_target,
        )  # fmt: skip
        if prepared:
            built = "once its rows are in" if prepared.deferred_key else "now"
            self.context.log.info(f"dpone: created target table {what.target} (key: {built})")
        return prepared

    def _load_keyless(self, partitions: list[str]) -> Backfill | None:
        """Every partition's batches into the target this step created without its key, then
        the key (the partitions' reconciliations follow in :meth:`run`); returns the last
        partition's backfill still open, so that its reconciliation reuses its sessions."""
        backfill: Backfill | None = None
        try:
            for partition in partitions:
                if backfill is not None:
                    backfill.close()
                backfill = self._backfill(self._range(partition), keyless_load=True)
                _cross_check(backfill, self._recorded_checkpoint(partition), partition)
                backfill.run(on_batch=partial(self.progress.report, partition), reconcile=False)
            if backfill is not None and backfill.build_key():
                self.context.log.info(f"dpone: built the primary key of {self.what.target}")
        except BaseException:
            if backfill is not None:
                backfill.close()
            raise
        return backfill

    def _backfill(self, rng: CursorRange, *, keyless_load: bool = False) -> Backfill:
        return Backfill(
            self.source.dsn,
            self.target.dsn,
            self.what.source,
            cursor=self.what.cursor,
            target_table=self.what.target,
            ledger=self.ledger,
            lower=rng.lower,
            upper=rng.upper,
            options=self.options,
            connection_options=self.source.options,
            target_connection_options=self.target.options,
            keyless_load=keyless_load,
        )

    def run(
        self,
        partition: str,
        rng: CursorRange,
        prepared: PreparedTarget | None = None,
        backfill: Backfill | None = None,
    ) -> dict[str, Any]:
        """Runs one partition's backfill to its mark; returns its check summary.

        When the run selected the check alone, nothing is copied (:meth:`_check_only`).

        Args:
            partition: The partition's key.
            rng: Its cursor range.
            prepared: What the step's preparation of the target did (its metadata goes with
                the first partition); prepared here when ``None``.
            backfill: The partition's backfill, open from its keyless load; a new one when
                ``None``.
        """
        what = self.what
        if what.key not in self.context.selected_asset_keys:
            return self._check_only(partition, rng)
        if prepared is None:
            prepared = self._prepare()
        with backfill or self._backfill(rng) as backfill:
            _cross_check(backfill, self._recorded_checkpoint(partition), partition)
            # A partition materialized again is a refresh in Dagster's eyes: a run already at
            # its mark is verified against the source as it is now (reverify), never assumed.
            result = backfill.run(
                on_batch=lambda batch: self.progress.report(partition, batch), reverify=True
            )
            receipts = backfill.receipts()
        self.progress.flush()  # the batches' observations precede the partition's metadata
        self.progress.partition_done(result.run.progress.copied_count)
        metadata = {
            **partition_metadata(result, receipts), **self._catalog_metadata(),
            **created_metadata(prepared.target_types, prepared.virtual_as_stored),
        }  # fmt: skip
        self.context.add_asset_metadata(metadata, asset_key=what.key, partition_key=partition)
        return _check_summary(partition, result)

    def _catalog_metadata(self) -> dict[str, Any]:
        """The target table's standard table set (name, column schema, column lineage)."""
        what, source = self.what, self.source
        return table_set(
            self.context, self.target, what.key, what.target,
            source=(source.dsn, source.options, [what.source]),
        )  # fmt: skip

    def _check_only(self, partition: str, rng: CursorRange) -> dict[str, Any]:
        """Reconciles (without repairing) a partition the ledger holds at its mark; a partition
        not backfilled to its mark yet has nothing to contradict."""
        with self._backfill(rng) as backfill:
            run = backfill.load()
            if run is None or run.status not in (BackfillStatus.SUCCEEDED, BackfillStatus.BLOCKED):
                state = "not started" if run is None else "not at its mark yet"
                return {"partition": partition, "ok": True, "detail": state}
            report = backfill.reconcile(repair=False)
        if not report.ok:
            raise BackfillReconciliationError(report)
        return {
            "partition": partition,
            "ok": True,
            "ranges": len(report.ranges),
            "proven_by_row_versions": report.proven_by(Proof.ROW_VERSIONS),
            "proved_at": report.proved_at.isoformat(),
        }

    def _recorded_checkpoint(self, partition: str) -> str | None:
        """The ``dpone/checkpoint`` of the partition's latest materialization in Dagster."""
        records = self.context.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=self.what.key, asset_partitions=[partition]), limit=1
        ).records
        if not records or records[0].asset_materialization is None:
            return None
        recorded = PartitionMetadataSet.read(
            records[0].asset_materialization.metadata, "checkpoint"
        )
        return recorded.checkpoint or None


def _cross_check(backfill: Backfill, recorded: str | None, partition: str) -> None:
    """Dagster's last checkpoint must be a link of the ledger's chain (the ledger may be ahead)."""
    if recorded is None:
        return
    chain = {r.checkpoint for r in backfill.receipts()} if backfill.load() is not None else set()
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


def _failed_check(partition: str, exc: BackfillReconciliationError) -> dict[str, Any]:
    """The check summary of a partition whose reconciliation failed."""
    report = exc.report
    return {
        "partition": partition, "ok": False, "code": exc.code,
        "differing": [r.sequence for r in report.differing],
        "differing_ranges": [[r.after, r.upper] for r in report.differing],
        "proved_at": report.proved_at.isoformat(),
    }  # fmt: skip


def _check_summary(partition: str, result: BackfillResult) -> dict[str, Any]:
    report = result.reconciliation
    return {
        "partition": partition,
        "ok": report is None or report.ok,
        "ranges": 0 if report is None else len(report.ranges),
        "proven_by_row_versions": 0 if report is None else report.proven_by(Proof.ROW_VERSIONS),
        "snapshot_label": result.run.snapshot_label.value,
        "proved_at": None if report is None else report.proved_at.isoformat(),
    }
