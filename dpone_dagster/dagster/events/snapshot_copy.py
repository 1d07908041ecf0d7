"""The snapshot copy's events: ``source.copy_tables(context, target=target)``.

Every selected table is read under the same source snapshot and loaded in one target
transaction, so the materializations of one run describe one consistent state of the source.
The step exports that snapshot and holds it while the copy reads under it, so each selected
``dpone_reconciled`` check compares the target with the source inside the very same snapshot,
after the load committed.
"""

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any, ClassVar

import dagster as dg

from dpone_dagster.dagster.failures import FailureCoding
from dpone_dagster.dagster.metadata.catalog import source_key_of, table_catalog_metadata
from dpone_dagster.dagster.metadata.keys.common import CommonMetadataSet
from dpone_dagster.dagster.metadata.parts import CHECK_NAME, log_schema_changes
from dpone_dagster.dagster.metadata.snapshot_copy import (
    copy_check_result,
    step_seconds_metadata,
    table_metadata,
)
from dpone_dagster.dagster.translator import CopyTableSpec, DponeTranslator, coerce_tables
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres import SnapshotSession
from dpone_dagster.reconcile import reconcile_copy
from dpone_dagster.snapshot_copy import CopyOptions, CopyReport, SnapshotCopy, SnapshotCopyOptions

from .databases import SourceDatabase, TargetDatabase
from .skeleton import JobEvents

CopyEvent = dg.MaterializeResult[Any] | dg.AssetCheckResult


def selected_tables(
    context: dg.AssetExecutionContext,
    tables: Sequence[str | CopyTableSpec | Mapping[str, Any]] | None,
    translator: DponeTranslator | None,
) -> dict[dg.AssetKey, CopyTableSpec]:
    """The tables of the selected assets, by key, in the asset definition's order.

    Raises:
        DponeError: ``plan_invalid`` when a selected asset names no table.
    """
    if tables is not None:
        tr = translator or DponeTranslator()
        by_key = {tr.get_asset_key(s): s for s in coerce_tables(tables)}
    else:
        by_key = {}
        for key, spec in context.assets_def.specs_by_key.items():
            names = CommonMetadataSet.read(spec.metadata, "source_table", "table")
            if names.source_table is None:
                raise DponeError(
                    "plan_invalid",
                    f"Asset {key.to_user_string()} names no table (no dpone/source_table).",
                    [
                        "Build the specs with DponeTranslator().get_asset_spec(...), or pass "
                        "tables= to copy_tables.",
                    ],
                )
            by_key[key] = CopyTableSpec(source=names.source_table, target=names.table)
    selected = context.selected_asset_keys
    return {key: spec for key, spec in by_key.items() if key in selected}


def copy_failure_metadata(error: DponeError) -> dict[str, Any]:
    """A copy failure's metadata: its terminal outcome, when the copy reached one."""
    report = getattr(error, "report", None)
    if isinstance(report, CopyReport):
        return dict(CommonMetadataSet(terminal_outcome=report.outcome.value))
    return {}


@dataclass(frozen=True)
class CopyEvents(JobEvents[CopyEvent]):
    """The events of one snapshot copy of the selected tables: iterating them runs the copy.

    :meth:`~dpone_dagster.PostgresSourceResource.copy_tables` returns one; the attributes are
    its arguments as plain values (the resources' databases, ``options`` built from its
    shortcuts). A failure carries the copy's terminal outcome, when it reached one.
    """

    coding: ClassVar[FailureCoding] = FailureCoding("target", metadata=copy_failure_metadata)

    context: dg.AssetExecutionContext
    _: KW_ONLY
    source: SourceDatabase
    target: TargetDatabase
    tables: Sequence[str | CopyTableSpec | Mapping[str, Any]] | None
    translator: DponeTranslator | None
    options: SnapshotCopyOptions

    def run(self) -> Iterator[CopyEvent]:
        """Copies the tables under one held snapshot; yields each table's materialization,
        then each selected ``dpone_reconciled`` check."""
        context, source, target = self.context, self.source, self.target
        chosen = selected_tables(context, self.tables, self.translator)
        checked = [
            key
            for key in chosen
            if dg.AssetCheckKey(key, CHECK_NAME) in context.selected_asset_check_keys
        ]
        # The copy reads under a snapshot this step holds, so the checks can read the source
        # under the very same snapshot after the load committed.
        with source.open_snapshot(export=True) as held:
            seconds: dict[str, float] = {}
            report = _copy(source, target, held, chosen, self.options, seconds)
            yield from _materializations(context, source, target, report, list(chosen), seconds)
            if checked:
                yield from _checks(source, target, held, report, list(chosen), checked)


def _copy(
    source: SourceDatabase,
    target: TargetDatabase,
    held: SnapshotSession,
    tables: Mapping[dg.AssetKey, CopyTableSpec],
    options: SnapshotCopyOptions,
    seconds: dict[str, float],
) -> CopyReport:
    """Copies the tables under the held snapshot; ``seconds`` gets each step's duration."""
    tuning = CopyOptions(
        source_options=source.options, target_options=target.options, snapshot_token=held.token
    )
    mappings = [(t.source_table, t.target_table) for t in tables.values()]
    with SnapshotCopy(
        source.dsn, target.dsn, mappings, options=options, tuning=tuning,
        create_extensions=target.create_extensions,
    ) as copy:  # fmt: skip
        source.track(copy)
        steps = (("plan", copy.plan), ("extract", copy.extract))
        for step, run in steps:
            started = time.monotonic()
            run()
            seconds[step] = time.monotonic() - started
        started = time.monotonic()
        report = copy.load()
        seconds["load"] = time.monotonic() - started
        return report


def _materializations(
    context: dg.AssetExecutionContext,
    source: SourceDatabase,
    target: TargetDatabase,
    report: CopyReport,
    keys: list[dg.AssetKey],
    seconds: dict[str, float],
) -> Iterator[dg.MaterializeResult[Any]]:
    """One materialization per copied table: its receipts, figures and the standard table set."""
    specs = context.assets_def.specs_by_key
    catalog = table_catalog_metadata(
        target.dsn,
        target.options,
        [
            (t.target, source_key_of(specs[key]), t.columns or None)
            for key, t in zip(keys, report.tables, strict=True)
        ],
        context.log,
        source=(source.dsn, source.options, [t.source for t in report.tables]),
    )
    for key, table, standard in zip(keys, report.tables, catalog, strict=True):
        log_schema_changes(context.log, table.target.qualified, table.schema_changes)
        metadata = {**table_metadata(report, table), **step_seconds_metadata(seconds), **standard}
        yield dg.MaterializeResult(asset_key=key, metadata=metadata)


def _checks(
    source: SourceDatabase,
    target: TargetDatabase,
    held: SnapshotSession,
    report: CopyReport,
    keys: list[dg.AssetKey],
    checked: list[dg.AssetKey],
) -> Iterator[dg.AssetCheckResult]:
    """Reconciles the checked tables inside the held snapshot."""
    wanted = [keys.index(key) for key in checked]
    subset = CopyReport(
        strategy=report.strategy,
        sink=report.sink,
        outcome=report.outcome,
        snapshot_label=report.snapshot_label,
        source_token=report.source_token,
        tables=tuple(report.tables[i] for i in wanted),
    )
    results = reconcile_copy(
        source.dsn, target.dsn, subset, held.token,
        source_options=source.options, target_options=target.options,
        snapshot_taken_at=held.evidence.acquired_at,
    )  # fmt: skip
    for key, result in zip(checked, results, strict=True):
        yield copy_check_result(key, result)
