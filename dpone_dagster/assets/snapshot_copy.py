"""``snapshot_copy_assets``: one multi-asset that copies a set of tables under ONE snapshot.

Every selected table is read under the same source snapshot and loaded in one target transaction,
so the materializations of one run describe one consistent state of the source. The asset is
subsettable: materializing a subset copies just those tables (still under one snapshot). Each
table's materialization carries the receipts: the extraction window and its clock, the snapshot
token digest, the terminal outcome and the snapshot label. The ``dpone_reconciled`` check compares
the target with the source, count and content hash, inside the copy's snapshot.
"""

# No `from __future__ import annotations`: Dagster reads the op's parameter annotations.
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import dagster as dg

from dpone_dagster.failures import DponeFailure
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres import CopyOptions, CopyReport, SnapshotCopy, Strategy
from dpone_dagster.postgres.plan import check_sink
from dpone_dagster.postgres.strategy import check_strategy as _check_strategy
from dpone_dagster.reconcile import TableReconciliation, reconcile_copy
from dpone_dagster.resources import PostgresSourceResource, PostgresTargetResource
from dpone_dagster.translator import CopyTableSpec, DponeTranslator

from .metadata import table_metadata

CopyStrategy = Literal[
    "whole_copy", "stream_rows", "batched_copy", "partitioned_copy", "internal_query"
]
CopySink = Literal["replace", "append", "merge"]

CHECK_NAME = "dpone_reconciled"


def coerce_tables(
    tables: Sequence[str | CopyTableSpec | Mapping[str, Any]],
) -> list[CopyTableSpec]:
    """Table specs from ``"schema.table"`` strings, mappings or specs; refuses duplicates."""
    specs = [CopyTableSpec.coerce(dict(t) if isinstance(t, Mapping) else t) for t in tables]
    if not specs:
        raise DponeError("plan_invalid", "No table to copy.", ["Name at least one table."])
    seen: dict[object, CopyTableSpec] = {}
    for spec in specs:
        if spec.target_table in seen:
            raise DponeError(
                "plan_invalid",
                f"Two tables are copied into {spec.target_table}: "
                f"{seen[spec.target_table].source} and {spec.source}.",
                ["Give each table its own target."],
            )
        seen[spec.target_table] = spec
    return specs


def check_strategy(strategy: str, sink: str, workers: int) -> Strategy:
    """The :class:`Strategy` named ``strategy``; fails at definition time for unknown values."""
    check_sink(sink)
    if workers < 1:
        raise DponeError("copy_options_invalid", "workers must be at least 1.", ["Use 1 or more."])
    return _check_strategy(strategy)


def copy_failure(exc: DponeError) -> DponeFailure:
    """A run failure for a copy error, with the terminal outcome when there was one."""
    report = getattr(exc, "report", None)
    if isinstance(report, CopyReport):
        return DponeFailure(exc, {"dpone/terminal_outcome": report.outcome.value})
    return DponeFailure(exc)


def _check_result(key: dg.AssetKey, result: TableReconciliation) -> dg.AssetCheckResult:
    """The ``dpone_reconciled`` result of one table."""
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=CHECK_NAME,
        passed=result.passed,
        description=result.detail,
        metadata={
            "dpone/guarantee": result.guarantee.value,
            "dpone/proof": result.proof.value,
            "dpone/source_rows": result.source.count,
            "dpone/target_rows": result.target.count,
            "dpone/source_digest": result.source.hash or "",
            "dpone/target_digest": result.target.hash or "",
        },
    )


def snapshot_copy_assets(
    tables: Sequence[str | CopyTableSpec | Mapping[str, Any]],
    *,
    strategy: CopyStrategy = "whole_copy",
    sink: CopySink = "replace",
    workers: int = 4,
    name: str | None = None,
    translator: DponeTranslator | None = None,
    group_name: str | None = None,
    pool: str | None = None,
    op_tags: Mapping[str, Any] | None = None,
    batch_rows: int | None = None,
    reconcile: bool = True,
) -> dg.AssetsDefinition:
    """One multi-asset that copies ``tables`` from the source under ONE snapshot.

    Args:
        tables: ``"schema.table"`` strings, or :class:`CopyTableSpec` (or mappings with
            ``source`` and ``target``) to copy into another name.
        strategy: ``whole_copy``, ``stream_rows``, ``batched_copy``, ``partitioned_copy`` or
            ``internal_query`` (source and target in one database).
        sink: ``replace`` (atomic), ``append`` or ``merge`` (by primary key).
        workers: Worker sessions of ``partitioned_copy``.
        name: The op's name (``snapshot_copy`` by default).
        translator: Maps each table to its asset spec (key ``[schema, table]`` by default).
        group_name: The asset group of every table.
        pool: Dagster concurrency pool limiting steps that read the source.
        op_tags: Tags of the op.
        batch_rows: Rows per batch of ``batched_copy``.
        reconcile: Declare the ``dpone_reconciled`` check of every table: after the load, the
            target is compared with the source inside the copy's snapshot (``replace``: equal
            count and content digest; ``merge``/keyed ``append``: every snapshot row present and
            equal; unkeyed ``append``: counts). It reads both sides once more; deselect the
            check (or pass False) where that costs too much.

    Returns:
        A subsettable multi-asset (resource keys ``source`` and ``target``).

    Raises:
        DponeError: at definition time: ``identifier_invalid`` for a bad name,
            ``copy_options_invalid`` for an unknown strategy or sink, ``plan_invalid`` for two
            tables copied into one target.

    Examples:
        .. code-block:: python

            shop = snapshot_copy_assets(
                ["shop.customers", "shop.orders", 'shop."Order Items"'],
                strategy="partitioned_copy",
                workers=2,
            )
    """
    engine_strategy = check_strategy(strategy, sink, workers)
    specs = coerce_tables(tables)
    tr = translator or DponeTranslator()
    asset_specs = [
        tr.get_asset_spec(s).merge_attributes(
            metadata={"dpone/strategy": strategy, "dpone/sink": sink}
        )
        for s in specs
    ]
    by_key = dict(zip([a.key for a in asset_specs], specs, strict=True))
    if len(by_key) != len(specs):
        raise DponeError(
            "plan_invalid", "Two tables map to one asset key.", ["Rename one through a translator."]
        )

    check_specs = [
        dg.AssetCheckSpec(
            CHECK_NAME,
            asset=a.key,
            description="The target equals (or contains) the source inside the copy's snapshot.",
        )
        for a in asset_specs
    ] if reconcile else []  # fmt: skip

    @dg.multi_asset(
        name=name or "snapshot_copy",
        specs=asset_specs,
        check_specs=check_specs,
        can_subset=True,
        pool=pool,
        op_tags=op_tags,
        group_name=group_name,
    )
    def _snapshot_copy(
        context: dg.AssetExecutionContext,
        source: PostgresSourceResource,
        target: PostgresTargetResource,
    ) -> Iterator[dg.MaterializeResult[Any] | dg.AssetCheckResult]:
        selected = [k for k in by_key if k in context.selected_asset_keys]
        checked = {c.asset_key for c in context.selected_asset_check_keys}
        mappings = [(by_key[k].source_table, by_key[k].target_table) for k in selected]
        reconciliations: list[TableReconciliation] = []
        try:
            # The copy reads under a snapshot this step holds, so the check can read the
            # source under the very same snapshot after the load committed.
            with source.open_snapshot(export=True) as held:
                copy_options = CopyOptions(
                    source_options=source.options,
                    target_options=target.options,
                    snapshot_token=held.token,
                    batch_rows=batch_rows or CopyOptions.batch_rows,
                )
                with SnapshotCopy(
                    source.dsn, target.dsn, mappings, strategy=engine_strategy, sink=sink,
                    workers=workers, options=copy_options,
                ) as copy:  # fmt: skip
                    source.track(copy)
                    copy.plan()
                    copy.extract()
                    report = copy.load()
                for key, table in zip(selected, report.tables, strict=True):
                    metadata = table_metadata(report, table)
                    metadata["dagster/row_count"] = table.rows_loaded or 0
                    yield dg.MaterializeResult(asset_key=key, metadata=metadata)
                if checked:
                    reconciliations = reconcile_copy(
                        source.dsn, target.dsn, report, held.token,
                        source_options=source.options, target_options=target.options,
                    )  # fmt: skip
        except DponeError as exc:
            raise copy_failure(exc) from exc
        for key, result in zip(selected, reconciliations, strict=False):
            if key in checked:
                yield _check_result(key, result)

    return _snapshot_copy
