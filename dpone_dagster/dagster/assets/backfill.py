"""``backfill_asset``: a partitioned asset that runs the ordered backfill for each partition.

A thin factory over :meth:`~dpone_dagster.PostgresSourceResource.backfill`, in the cursor
engine's asset shape (:mod:`.cursor_asset`): it checks the table, cursor and partitions when
the definitions load, builds the spec (naming the table, the target and the cursor, with its
partitions) and the ``dpone_reconciled`` check spec, and an op whose body is
``yield from source.backfill(context, target=target, ledger=ledger, options=options)``.
"""

# No `from __future__ import annotations`: Dagster reads the op's parameter annotations.
from collections.abc import Iterator, Mapping
from typing import Any

import dagster as dg

from dpone_dagster.backfill import BackfillOptions, OnChanged
from dpone_dagster.core.options import build_options
from dpone_dagster.dagster.events import BackfillEvent
from dpone_dagster.dagster.metadata.keys.backfill import PartitionMetadataSet
from dpone_dagster.dagster.partitions import PartitionError, partition_cursor_range
from dpone_dagster.dagster.resources import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
)
from dpone_dagster.dagster.translator import DponeTranslator

from .cursor_asset import cursor_asset, cursor_spec, reconciled_check


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
    options: BackfillOptions | None = None,
    batch_size: int | None = None,
    on_changed: OnChanged | str | None = None,
    target_table: str | None = None,
    translator: DponeTranslator | None = None,
    name: str | None = None,
    group_name: str | None = None,
    backfill_policy: dg.BackfillPolicy | None = None,
    pool: str | None = None,
    op_tags: Mapping[str, Any] | None = None,
    **legacy: Any,
) -> dg.AssetsDefinition:
    """A partitioned asset that backfills ``table`` range by range through the durable ledger.

    Args:
        table: The source table (``schema.table``; quote names that need it).
        cursor: The column batches are ordered by (integer, numeric, date or timestamp; with
            a unique index or the primary key starting with it).
        partitions_def: ``cursor_range_partitions(...)`` for an integer cursor, or any Dagster
            time-window partitions for a timestamp cursor.
        options: How each partition's backfill runs (:class:`~dpone_dagster.BackfillOptions`:
            batch size, ``reconcile``, ``on_changed``, settle timeout...); the defaults when
            ``None``. With ``reconcile=False`` the asset declares no ``dpone_reconciled`` check.
        batch_size: Shortcut for ``options.batch_size``: rows per batch (each batch commits
            with its receipt); by default chosen when each partition's run is planned, from
            the table's width.
        on_changed: Shortcut for ``options.on_changed``: ``"fail"`` (default) or ``"repair"``,
            what the reconciliation does with rows the source updated or deleted after their
            batch was copied.
        target_table: The target table; the source's name by default.
        translator: Maps the table to its asset spec (key ``[schema, table]`` by default).
        name: The op's name; derived from the key by default.
        group_name: The asset group.
        backfill_policy: Defaults to ``BackfillPolicy.single_run()`` (a partition range runs in
            one run, partitions in order); ``multi_run(1)`` gives each partition its own run.
        pool: Dagster concurrency pool limiting runs that read the source.
        op_tags: Tags of the op.
        **legacy: The other fields of :class:`~dpone_dagster.BackfillOptions` as keyword
            arguments (``reconcile=False``), as before the options object: accepted for one
            release, with a ``DeprecationWarning``.

    Returns:
        The asset definition (resource keys ``source``, ``target``, ``ledger``).
        It depends on its source table's external asset (see
        :func:`~dpone_dagster.source_asset_specs`); each materialization carries
        ``dagster/table_name``, ``dagster/column_schema`` (read from the target's catalog after
        the commit) and ``dagster/column_lineage``. The definition carries no column schema:
        reading a catalog when definitions load would make loading need a reachable database.

    Raises:
        DponeError: at definition time, for a bad table name (``identifier_invalid``), cursor,
            partitions or option (``plan_invalid``).
        TypeError: for a keyword argument that is neither an argument nor an option.

    Examples:
        .. code-block:: python

            events = backfill_asset(
                "events.page_views",
                cursor="id",
                partitions_def=cursor_range_partitions(0, 200_000, 50_000),
                options=BackfillOptions(on_changed="repair", settle_timeout=30),
            )
    """
    _check_partitions(partitions_def)
    shortcuts = {"batch_size": batch_size, "on_changed": on_changed}
    opts = build_options(
        BackfillOptions, options, caller="backfill_asset", shortcuts=shortcuts, legacy=legacy
    )
    spec_in, spec = cursor_spec(table, cursor, target_table, translator)
    reconciled = reconciled_check(spec.key, "Target equals source at the mark, per range.")
    spec = spec.replace_attributes(
        partitions_def=partitions_def,
        metadata={**spec.metadata, **PartitionMetadataSet(on_changed=opts.on_changed.value)},
    )

    def run(
        source: PostgresSourceResource, context: dg.AssetExecutionContext,
        target: PostgresTargetResource, ledger: LedgerResource,
    ) -> Iterator[BackfillEvent]:  # fmt: skip
        yield from source.backfill(context, target=target, ledger=ledger, options=opts)

    return cursor_asset(
        "backfill", spec_in, spec, run, check_specs=[reconciled] if opts.reconcile else [],
        name=name, group_name=group_name, pool=pool, op_tags=op_tags,
        partitions_def=partitions_def,
        backfill_policy=backfill_policy or dg.BackfillPolicy.single_run(),
    )  # fmt: skip
