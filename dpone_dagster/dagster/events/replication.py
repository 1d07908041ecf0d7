"""A replication group's events: ``source.replicate(context, target=target, ledger=ledger)``.

One materialization runs the group's engine once
(:class:`~dpone_dagster.replication.Replication`): the first run (or a resync) copies the tables
under the snapshot the slot was created with; every run then drains the slot up to the source's
LSN at its start, within the per-run budget, and applies the changes in commit order. It yields
one ``MaterializeResult`` per table (its changes by kind; the group's transactions, lag and slot
as numbers the UI plots) and, per table, the ``dpone_slot_healthy`` check and, for a group with a
freshness policy, the ``dpone_fresh`` check judging it by the table's lag
(:func:`~dpone_dagster.dagster.metadata.freshness.stream_freshness`), and, when the group is
reconciled, the ``dpone_reconciled`` check of each table (the keys the run applied and a slice of
the rolling sweep, :mod:`dpone_dagster.replication.verify`). The check alone, on whole tables, is
:func:`~dpone_dagster.dagster.jobs.replication_check_job` (the multi-asset is not
subsettable). A lost slot yields the failed checks, then fails the run with
``replication_slot_lost``, whose next action is the resync.

The run's log says what an on-call engineer looks for first: while it waits for a slot another
session holds, that it waits, for whom (the pid) and for how long at most, then how long it
took; and, once it has applied, one line with the transactions and each table's changes, the
lag, the WAL the slot retains (and the transactions holding it back) and each check's verdict
(:func:`~dpone_dagster.dagster.metadata.replication.run_summary`).
"""

from collections.abc import Iterator, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any, ClassVar

import dagster as dg
import psycopg

from dpone_dagster.core.ledger import LedgerConfig
from dpone_dagster.core.verification import Verification
from dpone_dagster.dagster.failures import FailureCoding
from dpone_dagster.dagster.metadata.keys.common import CommonMetadataSet
from dpone_dagster.dagster.metadata.keys.replication import ReplicationMetadataSet
from dpone_dagster.dagster.metadata.parts import CHECK_NAME, log_schema_changes
from dpone_dagster.dagster.metadata.replication import (
    SLOT_CHECK_NAME,
    replication_metadata,
    run_summary,
    slot_check,
    slot_wait_message,
)
from dpone_dagster.dagster.metadata.stream_check import verification_check
from dpone_dagster.dagster.translator import CopyTableSpec
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres.connection import connect
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.replication import ReplicationOptions
from dpone_dagster.replication.engine import Replication
from dpone_dagster.replication.failover import StandbySlot
from dpone_dagster.replication.group_plan import ReplicationGroup
from dpone_dagster.replication.replication_report import ReplicationProgress, ReplicationReport
from dpone_dagster.replication.slot import SlotStatus, slot_status

from .databases import Database, SourceDatabase
from .skeleton import JobEvents
from .tail import materialized, table_sets

ReplicationEvent = dg.AssetCheckResult | dg.MaterializeResult[Any]


@dataclass(frozen=True)
class GroupSpecs:
    """What a replication multi-asset's specs say: its tables by key, its slot and publication."""

    tables: Mapping[dg.AssetKey, CopyTableSpec]
    slot: str
    publication: str


def group_specs(assets_def: dg.AssetsDefinition) -> GroupSpecs:
    """The group of a multi-asset built by :func:`~dpone_dagster.replication_assets`.

    Raises:
        DponeError: ``plan_invalid`` when a spec names no table, or the specs name more than
            one slot or publication.
    """
    tables: dict[dg.AssetKey, CopyTableSpec] = {}
    groups = set()
    for key, spec in assets_def.specs_by_key.items():
        names = CommonMetadataSet.read(spec.metadata, "source_table", "table")
        if names.source_table is None:
            continue  # not a replicated table (a user's own spec beside them)
        tables[key] = CopyTableSpec(source=names.source_table, target=names.table)
        group = ReplicationMetadataSet.read(spec.metadata, "slot", "publication")
        groups.add((group.slot, group.publication))
    if not tables or len(groups) != 1 or None in next(iter(groups)):
        raise DponeError(
            "plan_invalid",
            f"Asset {assets_def.node_def.name} does not name one slot and one publication for "
            "its tables.",
            ["Build the asset with replication_assets(...)."],
        )
    [(slot, publication)] = groups
    return GroupSpecs(tables, str(slot), str(publication))


def _subset_refused(context: dg.AssetExecutionContext, group: GroupSpecs) -> DponeError | None:
    """The error for a run that selected only some of the group's tables (one slot feeds every
    table: applying part of a source transaction would split it)."""
    missing = [k.to_user_string() for k in group.tables if k not in context.selected_asset_keys]
    if not missing:
        return None
    return DponeError(
        "plan_invalid",
        f"A replication group is materialized whole: slot {group.slot} feeds every table of it, "
        f"and this run leaves out {', '.join(missing)}.",
        [
            "Select every table of the group (in a selection: "
            "AssetSelection.assets(key).required_multi_asset_neighbors()).",
        ],
    )


_UNCHECKED = (
    "This run verified nothing: it stopped at max_changes_per_run (dpone/budget_reached); its "
    "keys stay recorded and are checked by the first run that drains the slot."
)
"""The ``dpone_reconciled`` description of a run stopped by its budget (not verified)."""
_NOT_CHECKED = "This run verified nothing of the table: the group's check did not reach it."
"""The ``dpone_reconciled`` description of a table the check did not return (not verified)."""


def group_engine(
    group: GroupSpecs,
    *,
    source: SourceDatabase,
    target: Database,
    ledger: LedgerConfig,
    options: ReplicationOptions,
    **engine: Any,
) -> Replication:
    """The engine of the group the specs name, with ``options``, on the resources' databases
    (``engine``: the run's own arguments of
    :class:`~dpone_dagster.replication.engine.Replication`, ``resync``, ``adopt``...)."""
    spec = ReplicationGroup(
        tables=tuple(s.source_table for s in group.tables.values()),
        slot=group.slot,
        publication=group.publication,
        options=options,
    )
    return Replication(
        spec, source=source.dsn, target=target.dsn, ledger=ledger,
        connection_options=source.options, target_connection_options=target.options,
        standby=source.standby_dsn, **engine,
    )  # fmt: skip


@dataclass(frozen=True)
class ReplicationEvents(JobEvents[ReplicationEvent]):
    """The events of one run of a replication group: iterating them runs it.

    :meth:`~dpone_dagster.PostgresSourceResource.replicate` returns one; the attributes are its
    arguments as plain values (the resources' databases, ``ledger`` the ledger's settings, the
    default ledger's when it was not given, ``options`` built from its shortcuts). The engine
    codes its own errors; a bare database error is the source's, named by its kind.
    """

    coding: ClassVar[FailureCoding] = FailureCoding("source")

    context: dg.AssetExecutionContext
    _: KW_ONLY
    source: SourceDatabase
    target: Database
    ledger: LedgerConfig
    options: ReplicationOptions
    resync: bool = False
    adopt: bool = False

    def run(self) -> Iterator[ReplicationEvent]:
        """Runs the group once; yields each table's check (when declared), then its
        materialization; a lost slot yields the failed ``dpone_slot_healthy`` checks, then
        ends the run with ``replication_slot_lost``, the resync its first next action."""
        context = self.context
        group = group_specs(context.assets_def)
        refused = _subset_refused(context, group)
        if refused is not None:
            raise refused
        try:
            report = self._engine(group).run()
        except DponeError as exc:
            if exc.code != "replication_slot_lost":
                raise
            yield from self._checks(group, self._slot_now(group.slot))
            actions = [self._resync_action(), *exc.next_actions]
            raise DponeError(exc.code, exc.message, actions) from exc
        for table in report.tables:
            log_schema_changes(context.log, table.table.qualified, table.schema_changes)
        for removed in report.tables_removed:
            context.log.warning(
                f"dpone: {removed.qualified} left the group: publication {group.publication} "
                "no longer sends its changes; its target table is kept as it is."
            )
        for joined in report.tables_joined:
            context.log.info(f"dpone: {joined.qualified} was copied alone and joined the stream.")
        unchecked = _UNCHECKED if report.budget_reached else _NOT_CHECKED
        checks = [
            *self._checks(group, report.slot, report.standby),
            *self._verifications(group, report.checks, unchecked),
        ]
        yield from checks
        yield from self._materializations(group, report)
        context.log.info(run_summary(report, checks))

    def _reconciled(self, group: GroupSpecs) -> list[dg.AssetKey]:
        """The tables whose ``dpone_reconciled`` check this run reports."""
        selected = self.context.selected_asset_check_keys
        return [k for k in group.tables if dg.AssetCheckKey(k, CHECK_NAME) in selected]

    def _verifications(
        self, group: GroupSpecs, checks: Mapping[TableName, Verification], missing: str
    ) -> Iterator[dg.AssetCheckResult]:
        """``dpone_reconciled`` of every table that declares it (``missing``: the description
        of a table without a verification)."""
        for key in self._reconciled(group):
            yield verification_check(key, checks.get(group.tables[key].source_table), missing)

    def _engine(self, group: GroupSpecs) -> Replication:
        """The group's engine, with the options (checking the run only when a
        ``dpone_reconciled`` check of it is selected)."""
        checked = self.options.reconcile and bool(self._reconciled(group))
        options = self.options if checked else self.options.replace(reconcile=False)
        return group_engine(
            group, source=self.source, target=self.target, ledger=self.ledger, options=options,
            adopt=self.adopt, resync=self.resync, on_progress=self._progress,
        )  # fmt: skip

    def _progress(self, progress: ReplicationProgress) -> None:
        """Logs the run's wait for a slot another session holds (for whom, how long)."""
        if progress.wait is not None:
            level, line = slot_wait_message(progress.wait, self.context.op_def.pool)
            getattr(self.context.log, level)(line)

    def _resync_action(self) -> str:
        """The resync, as a Dagster user launches it."""
        op = self.context.op_def.name
        return (
            f"Resync: launch the run again with the op's config resync: true (Launchpad: "
            f"ops: {{{op}: {{config: {{resync: true}}}}}}); the slot is created again and the "
            "tables are copied under its snapshot."
        )

    def _slot_now(self, slot: str) -> SlotStatus | None:
        """The slot as the source reports it now (for the checks of a failed run)."""
        try:
            with connect(self.source.dsn, self.source.options, side="source") as conn:
                return slot_status(conn, slot)
        except (DponeError, psycopg.Error) as exc:
            self.context.log.warning(f"dpone: the slot {slot} could not be read: {exc}")
            return None

    def _checks(
        self, group: GroupSpecs, status: SlotStatus | None, standby: StandbySlot | None = None
    ) -> Iterator[dg.AssetCheckResult]:
        """``dpone_slot_healthy`` of every table that declares it."""
        selected = self.context.selected_asset_check_keys
        for key in group.tables:
            if dg.AssetCheckKey(key, SLOT_CHECK_NAME) in selected:
                warn_bytes = self.options.retained_wal_warn_bytes
                yield slot_check(key, group.slot, status, warn_bytes, standby)

    def _materializations(
        self, group: GroupSpecs, report: ReplicationReport
    ) -> Iterator[ReplicationEvent]:
        """One materialization per table: its changes, the group's figures, its table set."""
        by_source = {t.table: t for t in report.tables}
        standard = table_sets(
            self.context, self.target, [(k, s.target_table) for k, s in group.tables.items()],
            source=(self.source.dsn, self.source.options,
                    [s.source_table for s in group.tables.values()]),
        )  # fmt: skip
        for (key, spec), table_set in zip(group.tables.items(), standard, strict=True):
            metadata = replication_metadata(
                report, by_source.get(spec.source_table), spec.source_table
            )
            yield from materialized(self.context, key, {**metadata, **table_set})
