"""The entries of a ``PostgresCopyComponent``'s YAML: a snapshot copy, a backfill (with its
partitions) and an incremental stream, each resolved into the arguments of its asset factory
(the backfill's options into one :class:`~dpone_dagster.BackfillOptions`, the stream's into one
:class:`~dpone_dagster.incremental.IncrementalOptions`).
"""

# No `from __future__ import annotations`: Dagster's Resolvable reads the field annotations.
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Annotated, Any

import dagster as dg

from dpone_dagster.backfill import BackfillOptions, OnChanged
from dpone_dagster.core.deletes import Deletes
from dpone_dagster.dagster.partitions import cursor_range_partitions
from dpone_dagster.dagster.translator import CopyTableSpec
from dpone_dagster.incremental import CheckScope, IncrementalOptions
from dpone_dagster.postgres import SchemaChanges, Sink
from dpone_dagster.snapshot_copy import SnapshotCopyOptions, Strategy

from .attributes import InlineAttributes, ResolvedTableAttributes, TableModel


def _resolve_tables(context: dg.ResolutionContext, entries: list[Any]) -> list[str | TableModel]:
    """A table as its SQL name, or as an entry with its own target and asset attributes."""
    return [
        entry if isinstance(entry, str) else TableModel.resolve_from_model(context, entry)
        for entry in entries
    ]


ResolvedTables = Annotated[
    list[str | TableModel],
    dg.Resolver(_resolve_tables, model_field_type=list[str | TableModel.model()]),  # type: ignore[misc]
]
"""Tables from YAML: plain names and entries with attributes, mixed in one list."""


@dataclass
class SnapshotCopyModel(dg.Resolvable):
    """One snapshot copy: the tables read under one snapshot, and how.

    Attributes:
        tables: Source tables as SQL names (``shop.orders``, ``'shop."Order Items"'``), or
            entries with ``source``, ``target`` and the table's own asset attributes.
        targets: Optional renames: source name -> target name.
        strategy: ``whole_copy``, ``stream_rows``, ``batched_copy``, ``partitioned_copy`` or
            ``internal_query``.
        sink: ``replace``, ``append`` or ``merge``.
        schema_changes: ``evolve`` (an existing target takes added columns, widened types and
            keeps dropped columns, with the data) or ``freeze`` (any difference is refused).
        workers: Worker sessions of ``partitioned_copy``.
        batch_size: Rows per range of ``batched_copy`` (250,000 by default).
        name: The op's name.
        group_name: The assets' group.
        pool: Concurrency pool.
    """

    tables: ResolvedTables
    targets: dict[str, str] | None = None
    strategy: Strategy = Strategy.BATCHED_COPY
    sink: Sink = Sink.REPLACE
    schema_changes: SchemaChanges = SchemaChanges.EVOLVE
    workers: int = 4
    batch_size: int | None = None
    name: str | None = None
    group_name: str | None = None
    pool: str | None = None

    def options(self) -> SnapshotCopyOptions:
        """The copy's options, from this entry's keys that name one.

        Raises:
            DponeError: ``copy_options_invalid`` for an invalid value.
        """
        names = SnapshotCopyOptions.model_fields.keys() & {f.name for f in fields(self)}
        return SnapshotCopyOptions.parse({name: getattr(self, name) for name in names})


@dataclass
class RangePartitionsModel(dg.Resolvable):
    """``cursor_range_partitions(start, stop, step)``."""

    start: int
    stop: int
    step: int


@dataclass
class DailyPartitionsModel(dg.Resolvable):
    """``DailyPartitionsDefinition(start_date, end_date)`` for a timestamp cursor."""

    start_date: str
    end_date: str | None = None


@dataclass(kw_only=True)
class BackfillModel(InlineAttributes):
    """One partitioned backfill, with its asset's attributes.

    The keys that are fields of :class:`~dpone_dagster.BackfillOptions` (``batch_size``,
    ``on_changed``) resolve into one (:meth:`options`).

    Attributes:
        table: The source table.
        cursor: The column batches are ordered by.
        range_partitions: Integer cursor ranges (or ``daily_partitions`` for a timestamp).
        daily_partitions: One partition per day of a timestamp cursor.
        batch_size: Rows per committed batch (by default chosen from the table's width).
        target: The target table (the source's name by default).
        group_name: The asset's group.
        pool: Concurrency pool.
        on_changed: ``fail`` (default) or ``repair``: what the reconciliation does with rows
            the source changed or deleted after their batch was copied (``backfill_asset``).
        attributes: The asset's attributes (Dagster's: ``key``, ``description``, ``tags``,
            ``kinds``, ``owners``...), over the component's.
    """

    table: str
    cursor: str
    range_partitions: RangePartitionsModel | None = None
    daily_partitions: DailyPartitionsModel | None = None
    batch_size: int | None = None
    target: str | None = None
    group_name: str | None = None
    pool: str | None = None
    on_changed: OnChanged = OnChanged.FAIL
    attributes: ResolvedTableAttributes = field(default_factory=dict)

    def spec(self) -> CopyTableSpec:
        """The table spec this backfill names."""
        return CopyTableSpec(source=self.table, target=self.target)

    def all_attributes(self) -> Mapping[str, Any]:
        """The asset's attributes: those written inline (deprecated), then ``attributes``."""
        return {**self.inline_attributes(f"backfill {self.table}"), **self.attributes}

    def options(self) -> BackfillOptions:
        """The backfill's options, from this entry's keys that name one.

        Raises:
            DponeError: ``plan_invalid`` for an invalid value.
        """
        names = BackfillOptions.model_fields.keys() & {f.name for f in fields(self)}
        return BackfillOptions.parse({name: getattr(self, name) for name in names})

    def partitions_def(self) -> dg.PartitionsDefinition:
        """The partitions the YAML asked for (exactly one kind)."""
        if (self.range_partitions is None) == (self.daily_partitions is None):
            raise ValueError(
                f"backfill of {self.table}: give exactly one of range_partitions or "
                "daily_partitions"
            )
        if self.range_partitions is not None:
            r = self.range_partitions
            return cursor_range_partitions(r.start, r.stop, r.step)
        assert self.daily_partitions is not None
        d = self.daily_partitions
        return dg.DailyPartitionsDefinition(start_date=d.start_date, end_date=d.end_date)


@dataclass(kw_only=True)
class IncrementalStreamModel(InlineAttributes):
    """One incremental stream (``incremental_asset``), with its asset's attributes.

    The stream's options resolve into one
    :class:`~dpone_dagster.incremental.IncrementalOptions` (:meth:`options`); an option left
    out takes that object's default.

    Attributes:
        table: The source table.
        cursor: The column that grows when a row is inserted or updated (indexed, never NULL).
        deletes: ``ignore`` (default), ``hard``, ``soft`` or ``sweep`` (found by the rolling
            sweep, at most one full sweep late).
        soft_delete_column: The ``timestamptz`` column ``soft`` sets (added if missing).
        batch_size: Rows per committed batch.
        target: The target table (the source's name by default).
        lookback_seconds: Seconds below the mark every run reads again (a cursor set from a
            client clock that may run behind the server's).
        continue_from_backfill: Start an empty stream at the mark of a complete backfill of
            the same table and cursor.
        settle_timeout: Seconds a run waits for transactions open at its mark.
        schema_changes: ``evolve`` (default) or ``freeze``.
        fillfactor: The ``fillfactor`` of a target the first run creates (100 packs pages full).
        check: What the ``dpone_reconciled`` check compares: ``run`` (default: the run's keys
            and a slice of the rolling sweep) or ``full`` (both whole tables, every run).
        sweep_runs: A full sweep in about this many runs (288: a day at five minutes).
        sweep_rows: Instead, rows per run, whatever the table's size.
        sweep_seconds: Instead, seconds per run.
        repair: Rewrite the keys the check finds differing (the target changed behind the
            stream's back) from the source, in the run; the check then passes saying so.
        group_name: The asset's group.
        pool: Concurrency pool.
        cron_schedule: When set, a schedule named after the asset materializes it (with its
            checks) on this cron expression, and the asset carries the freshness policy it
            implies and the ``dpone_fresh`` check (see ``incremental_asset``).
        attributes: The asset's attributes (Dagster's: ``key``, ``description``, ``tags``,
            ``kinds``, ``owners``...), over the component's.
    """

    table: str
    cursor: str
    deletes: Deletes | None = None
    soft_delete_column: str | None = None
    batch_size: int | None = None
    target: str | None = None
    lookback_seconds: float | None = None
    continue_from_backfill: bool | None = None
    settle_timeout: float | None = None
    schema_changes: SchemaChanges | None = None
    fillfactor: int | None = None
    check: CheckScope | None = None
    sweep_runs: int | None = None
    sweep_rows: int | None = None
    sweep_seconds: float | None = None
    repair: bool | None = None
    group_name: str | None = None
    pool: str | None = None
    cron_schedule: str | None = None
    attributes: ResolvedTableAttributes = field(default_factory=dict)

    def spec(self) -> CopyTableSpec:
        """The table spec this stream names."""
        return CopyTableSpec(source=self.table, target=self.target)

    def options(self) -> IncrementalOptions:
        """The stream's options: those the entry gives, over the defaults.

        Raises:
            EngineError: ``incremental_options_invalid`` for an invalid value.
        """
        budget = {"runs": self.sweep_runs, "rows": self.sweep_rows, "seconds": self.sweep_seconds}
        sweep = {k: v for k, v in budget.items() if v is not None}
        given = {
            "deletes": self.deletes, "soft_delete_column": self.soft_delete_column,
            "batch_size": self.batch_size, "continue_from_backfill": self.continue_from_backfill,
            "settle_timeout": self.settle_timeout, "schema_changes": self.schema_changes,
            "fillfactor": self.fillfactor, "check": self.check, "repair": self.repair,
            "lookback": self.lookback_seconds,  # seconds, as a timedelta
            "sweep": sweep or None,  # a Sweep's fields
        }  # fmt: skip
        return IncrementalOptions.parse({k: v for k, v in given.items() if v is not None})

    def all_attributes(self) -> Mapping[str, Any]:
        """The asset's attributes: those written inline (deprecated), then ``attributes``."""
        return {**self.inline_attributes(f"stream {self.table}"), **self.attributes}
