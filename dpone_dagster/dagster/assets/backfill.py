"""``backfill_asset``: a partitioned asset that runs the ordered backfill for each partition.

A thin factory over :meth:`~dpone_dagster.PostgresSourceResource.backfill`: it checks the
table, cursor and partitions when the definitions load, builds the spec (naming the table, the
target and the cursor) and the ``dpone_reconciled`` check spec, and an op whose body is
``yield from source.backfill(context, target=target, ledger=ledger, ...)``.
"""

# No `from __future__ import annotations`: Dagster reads the op's parameter annotations.
from collections.abc import Iterator, Mapping
from typing import Any

import dagster as dg

from dpone_dagster.backfill import OnChanged
from dpone_dagster.dagster.events import BackfillEvent
from dpone_dagster.dagster.metadata.receipts import CHECK_NAME
from dpone_dagster.dagster.metadata.sets import DponeMetadataSet, DponeRunTags
from dpone_dagster.dagster.partitions import PartitionError, partition_cursor_range
from dpone_dagster.dagster.resources import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
)
from dpone_dagster.dagster.run_plane.instance import check_instance_storage
from dpone_dagster.dagster.translator import CopyTableSpec, DponeTranslator
from dpone_dagster.postgres import BatchSize, check_identifier


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


def backfill_asset(
    table: str,
    *,
    cursor: str,
    partitions_def: dg.PartitionsDefinition,
    batch_size: int | None = None,
    target_table: str | None = None,
    translator: DponeTranslator | None = None,
    name: str | None = None,
    group_name: str | None = None,
    backfill_policy: dg.BackfillPolicy | None = None,
    pool: str | None = None,
    op_tags: Mapping[str, Any] | None = None,
    reconcile: bool = True,
    on_changed: OnChanged | str = OnChanged.FAIL,
) -> dg.AssetsDefinition:
    """A partitioned asset that backfills ``table`` range by range through the durable ledger.

    Args:
        table: The source table (``schema.table``; quote names that need it).
        cursor: The column batches are ordered by (integer, numeric, date or timestamp; with
            a unique index or the primary key starting with it).
        partitions_def: ``cursor_range_partitions(...)`` for an integer cursor, or any Dagster
            time-window partitions for a timestamp cursor.
        batch_size: Rows per batch (each batch commits with its receipt); by default chosen
            when each partition's run is planned, from the table's width (about 64 MiB of it
            a batch: :mod:`dpone_dagster.backfill.batch_size`).
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
        on_changed: What the reconciliation does with rows the source updated or deleted after
            their batch was copied: ``"fail"`` (default) keeps the copied history and fails the
            partition with ``backfill_record_changed``; ``"repair"`` rewrites the differing
            ranges from the reconciliation's one source snapshot (rows updated, deleted,
            inserted; label ``repaired_to_one_snapshot``). For a table that keeps changing
            after its backfill, see ``incremental_asset``.

    Returns:
        The asset definition (resource keys ``source``, ``target``, ``ledger``).
        It depends on its source table's external asset (see
        :func:`~dpone_dagster.source_asset_specs`); each materialization carries
        ``dagster/table_name``, ``dagster/column_schema`` (read from the target's catalog after
        the commit) and ``dagster/column_lineage``. The definition carries no column schema:
        reading a catalog when definitions load would make loading need a reachable database.

    Raises:
        DponeError: at definition time, for a bad table name (``identifier_invalid``), cursor,
            partitions or ``on_changed`` (``plan_invalid``).

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
    check_instance_storage()
    changed = OnChanged.parse(on_changed)
    rows = None if batch_size is None else BatchSize.parse(batch_size, refusal="plan_invalid")
    spec = (translator or DponeTranslator()).get_asset_spec(spec_in)
    check = dg.AssetCheckSpec(
        CHECK_NAME, asset=spec.key, description="Target equals source at the mark, per range."
    )

    @dg.multi_asset(
        name=name or f"backfill_{spec.key.to_python_identifier()}",
        specs=[
            spec.replace_attributes(
                partitions_def=partitions_def,
                metadata={
                    **spec.metadata,
                    **DponeMetadataSet(cursor=cursor, on_changed=changed.value),
                },
            )
        ],
        check_specs=[check] if reconcile else [],
        can_subset=True,
        partitions_def=partitions_def,
        backfill_policy=backfill_policy or dg.BackfillPolicy.single_run(),
        pool=pool,
        op_tags={**(op_tags or {}), **DponeRunTags(source_table=spec_in.source_table.qualified)},
        group_name=group_name,
    )
    def _backfill(
        context: dg.AssetExecutionContext,
        source: PostgresSourceResource,
        target: PostgresTargetResource,
        ledger: LedgerResource,
    ) -> Iterator[BackfillEvent]:
        yield from source.backfill(
            context, target=target, ledger=ledger, batch_size=rows, reconcile=reconcile,
            on_changed=changed,
        )  # fmt: skip

    return _backfill
