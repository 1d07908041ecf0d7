"""``build_extraction_job``: a snapshot copy as a job of ``acquire -> extract -> load -> settle``;
``drop_replication_job``: the job that ends a replication group (drops its slot and publication);
``replication_check_job``: a group's ``dpone_reconciled`` check run alone, on whole tables.

The steps hand a live copy (source sessions, a target session, artifacts) to each other. A live
session cannot be pickled, so the job runs on Dagster's in-process executor, the source resource
holds the live copy, and the steps pass its handle (a string) through the IO manager. (An
in-memory IO manager bound to the job would do too, but Dagster then demands that the job bind
every resource it uses, and ``source``/``target`` belong to the user's ``Definitions``.)
Whatever step fails, the copy is settled before the failure propagates
(``abort``, or ``retain_commit_unknown`` when the target's COMMIT acknowledgement was lost), the
outcome is written to the run's log as a structured ``dpone terminal outcome`` line, and no
source transaction stays open; the source resource's teardown is the backstop that settles and
closes anything a step left behind.
"""

# No `from __future__ import annotations`: Dagster reads the op's parameter annotations.
import json
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import dagster as dg

from dpone_dagster.core.deletes import Deletes
from dpone_dagster.core.options import build_options
from dpone_dagster.dagster.events.replication import group_engine, group_specs
from dpone_dagster.dagster.events.snapshot_copy import CopyEvents
from dpone_dagster.dagster.failures import dagster_failures
from dpone_dagster.dagster.metadata.catalog import table_catalog_metadata
from dpone_dagster.dagster.metadata.parts import CHECK_NAME, log_schema_changes
from dpone_dagster.dagster.metadata.snapshot_copy import table_metadata
from dpone_dagster.dagster.metadata.stream_check import verification_check
from dpone_dagster.dagster.metadata.tags import DponeRunTags
from dpone_dagster.dagster.resources import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
)
from dpone_dagster.dagster.run_plane.instance import check_instance_storage
from dpone_dagster.dagster.translator import CopyTableSpec, DponeTranslator
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres import Sink
from dpone_dagster.replication import ReplicationOptions
from dpone_dagster.snapshot_copy import (
    CopyOptions,
    CopyReport,
    SnapshotCopy,
    SnapshotCopyOptions,
    Strategy,
)

_T = TypeVar("_T")


def _outcome_line(copy: SnapshotCopy) -> str:
    """The terminal outcome of every table, as one JSON log line."""
    report = copy.report
    if report is None:
        return json.dumps({"dpone_terminal_outcome": None})
    return json.dumps(
        {
            "dpone_terminal_outcome": report.outcome.value,
            "tables": [
                {
                    "table": t.target.qualified,
                    "outcome": t.terminal_receipt.outcome.value if t.terminal_receipt else None,
                    "sources_closed": t.terminal_receipt.sources_closed
                    if t.terminal_receipt
                    else None,
                }
                for t in report.tables
            ],
        }
    )


def _guarded(context: dg.OpExecutionContext, copy: SnapshotCopy, step: Callable[[], _T]) -> _T:
    """Runs one step; on any failure settles the copy, logs its outcome and re-raises."""
    try:
        return step()
    except BaseException as exc:
        copy.close()  # settles what is undecided (abort) and closes every session
        context.log.error(f"dpone terminal outcome: {_outcome_line(copy)}")
        if isinstance(exc, DponeError):
            raise CopyEvents.coding.failure(exc) from exc
        raise


def _materializations(
    context: dg.OpExecutionContext,
    source: PostgresSourceResource,
    target: PostgresTargetResource,
    report: CopyReport,
    key: dg.AssetKey,
    source_key: dg.AssetKey | None,
) -> Iterator[dg.AssetMaterialization]:
    """The settled copy's materialization: its receipts and the standard table set."""
    for table_report in report.tables:
        changes = table_report.schema_changes
        log_schema_changes(context.log, table_report.target.qualified, changes)
        [standard] = table_catalog_metadata(
            target.dsn,
            target.options,
            [(table_report.target, source_key, table_report.columns or None)],
            context.log,
            source=(source.dsn, source.options, [table_report.source]),
        )
        metadata: dict[str, Any] = {**table_metadata(report, table_report), **standard}
        yield dg.AssetMaterialization(asset_key=key, metadata=metadata)


def build_extraction_job(
    table: str | CopyTableSpec,
    *,
    options: SnapshotCopyOptions | None = None,
    strategy: Strategy | str | None = None,
    sink: Sink | str | None = None,
    name: str | None = None,
    translator: DponeTranslator | None = None,
    **legacy: Any,
) -> dg.JobDefinition:
    """A job that copies one table in four visible steps.

    ``acquire`` plans the copy (both catalogs, the target session), ``extract`` acquires the
    snapshot and extracts, ``load`` stages, applies the sink and commits, ``settle`` records the
    terminal outcome and materializes the target table's asset.

    Args:
        table: The source table (``"schema.table"``) or a spec with a renamed target.
        options: The copy's options (:class:`~dpone_dagster.snapshot_copy.SnapshotCopyOptions`:
            strategy, sink, workers, batch size, schema changes), as
            :func:`~dpone_dagster.snapshot_copy_assets` takes them.
        strategy: Shortcut for ``options.strategy``.
        sink: Shortcut for ``options.sink``.
        name: The job's name (``extract_<schema>_<table>`` by default).
        translator: Maps the table to the asset key its materialization is recorded under.
        **legacy: ``workers`` and ``schema_changes`` as keywords: deprecated
            (``options=SnapshotCopyOptions(...)``), for one release.

    Returns:
        The job (in-process executor; resources ``source`` and ``target``).

    Raises:
        DponeError: at definition time, for a bad name, strategy or sink.
    """
    how = build_options(SnapshotCopyOptions, options, caller="build_extraction_job",
                        shortcuts={"strategy": strategy, "sink": sink}, legacy=legacy)  # fmt: skip
    check_instance_storage()
    spec = CopyTableSpec.coerce(table)
    tr = translator or DponeTranslator()
    key = tr.get_asset_key(spec)
    source_key = tr.get_source_asset_key(spec) if tr.source_assets else None
    mapping = (spec.source_table, spec.target_table)

    @dg.op(name="acquire")
    def acquire(
        context: dg.OpExecutionContext,
        source: PostgresSourceResource,
        target: PostgresTargetResource,
    ) -> str:
        copy = SnapshotCopy(
            source.dsn, target.dsn, [mapping], options=how,
            tuning=CopyOptions(source_options=source.options, target_options=target.options),
            create_extensions=target.create_extensions,
        )  # fmt: skip
        handle = source.hold(copy)
        _guarded(context, copy, copy.plan)
        return handle

    @dg.op(name="extract")
    def extract(context: dg.OpExecutionContext, source: PostgresSourceResource, copy: str) -> str:
        live = source.held(copy, SnapshotCopy)
        _guarded(context, live, live.extract)
        return copy

    @dg.op(name="load")
    def load(context: dg.OpExecutionContext, source: PostgresSourceResource, copy: str) -> str:
        live = source.held(copy, SnapshotCopy)
        _guarded(context, live, live.load)
        return copy

    @dg.op(name="settle", out={})
    def settle(
        context: dg.OpExecutionContext,
        source: PostgresSourceResource,
        target: PostgresTargetResource,
        copy: str,
    ) -> Iterator[dg.AssetMaterialization]:
        live = source.held(copy, SnapshotCopy)
        report: CopyReport | None = live.report
        live.close()
        context.log.info(f"dpone terminal outcome: {_outcome_line(live)}")
        if report is not None:
            yield from _materializations(context, source, target, report, key, source_key)

    @dg.job(
        name=name or f"extract_{key.to_python_identifier()}",
        executor_def=dg.in_process_executor,
        tags=dict(DponeRunTags(source_table=spec.source_table.qualified)),
    )
    def _job() -> None:
        settle(load(extract(acquire())))

    return _job


def drop_replication_job(
    replication: dg.AssetsDefinition, *, name: str | None = None
) -> dg.JobDefinition:
    """A job that drops a replication group's slot and publication on the source.

    It is :meth:`~dpone_dagster.PostgresSourceResource.drop_replication` as a job, to launch
    from the UI when a group is retired: a slot nobody drains keeps the source's WAL until its
    disk fills. Its one op logs what it dropped; a slot in use or not dpone's fails it with the
    code (nothing dropped). A later materialization of the group starts over with an initial
    copy.

    Args:
        replication: The multi-asset :func:`~dpone_dagster.replication_assets` built.
        name: The job's name (``drop_<op name>`` by default).

    Returns:
        The job (resource key ``source``).

    Raises:
        DponeFailure: at definition time, ``plan_invalid`` for an asset that names no group.

    Examples:
        .. code-block:: python

            shop = replication_assets(["shop.orders", "shop.customers"], slot="dpone_shop")
            defs = dg.Definitions(assets=[shop], jobs=[drop_replication_job(shop)], ...)
    """
    with dagster_failures():
        group = group_specs(replication)
    job_name = name or f"drop_{replication.node_def.name}"

    @dg.op(name=f"{job_name}_op", tags=dict(DponeRunTags(slot=group.slot)))
    def drop(context: dg.OpExecutionContext, source: PostgresSourceResource) -> None:
        with dagster_failures():
            dropped = source.drop_replication(group.slot, publication=group.publication)
        context.log.info(
            f"dpone: slot {group.slot} {'dropped' if dropped.slot else 'was already gone'}, "
            f"publication {group.publication} "
            f"{'dropped' if dropped.publication else 'was already gone'}."
        )

    @dg.job(name=job_name, tags=dict(DponeRunTags(slot=group.slot)))
    def _job() -> None:
        drop()

    return _job


def replication_check_job(
    replication: dg.AssetsDefinition,
    *,
    options: ReplicationOptions | None = None,
    deletes: Deletes | str | None = None,
    name: str | None = None,
) -> dg.JobDefinition:
    """A job that runs a replication group's ``dpone_reconciled`` check alone, on whole tables.

    The multi-asset is not subsettable, so its checks cannot be selected without its tables:
    this job is the check run alone (as the stream's check run alone), to launch from the UI or
    on a schedule of its own. Its one op compares both whole tables of every table of the group
    with the source, applying nothing (:meth:`~dpone_dagster.replication.Replication.check`: a
    difference whose key a transaction changed after the applied position, still in the slot,
    is left to the next run), and records each table's ``dpone_reconciled`` evaluation (scope
    ``full``).

    Args:
        replication: The multi-asset :func:`~dpone_dagster.replication_assets` built.
        options: The group's options as given to the factory: its ``deletes`` and
            ``soft_delete_column`` (``soft``: rows the soft-delete column marks are not the
            target's).
        deletes: Shortcut for ``options.deletes``.
        name: The job's name (``check_<op name>`` by default).

    Returns:
        The job (resource keys ``source``, ``target``, ``ledger``).

    Raises:
        DponeFailure: at definition time, ``plan_invalid`` for an asset that names no group;
            in the run, the engine's codes.

    Examples:
        .. code-block:: python

            shop = replication_assets(["shop.orders"], slot="dpone_shop")
            defs = dg.Definitions(assets=[shop], jobs=[replication_check_job(shop)], ...)
    """
    with dagster_failures():
        group = group_specs(replication)
    job_name = name or f"check_{replication.node_def.name}"
    how = build_options(
        ReplicationOptions, options, caller="replication_check_job", shortcuts={"deletes": deletes}
    )

    @dg.op(name=f"{job_name}_op", tags=dict(DponeRunTags(slot=group.slot)))
    def check(
        context: dg.OpExecutionContext,
        source: PostgresSourceResource,
        target: PostgresTargetResource,
        ledger: LedgerResource,
    ) -> None:
        with dagster_failures():
            engine = group_engine(group, source=source.database, target=target.database,
                                  ledger=ledger.config(target), options=how)  # fmt: skip
            checks = engine.check()
        for key, spec in group.tables.items():
            missing = "No run has completed yet, or the table has no primary key."
            found = verification_check(key, checks.get(spec.source_table), missing)
            evaluation = dg.AssetCheckEvaluation(
                asset_key=key, check_name=CHECK_NAME, passed=found.passed,
                metadata=found.metadata, description=found.description,
            )  # fmt: skip
            context.log_event(evaluation)  # type: ignore[arg-type]  # Dagster logs any evaluation

    @dg.job(name=job_name, tags=dict(DponeRunTags(slot=group.slot)))
    def _job() -> None:
        check()

    return _job
