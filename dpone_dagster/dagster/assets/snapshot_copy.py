"""``snapshot_copy_assets``: one multi-asset that copies a set of tables under ONE snapshot.

A thin factory over :meth:`~dpone_dagster.PostgresSourceResource.copy_tables`: it builds the
specs (keys from the translator, each spec naming its tables), the ``dpone_reconciled`` check
specs, and an op whose body is ``yield from source.copy_tables(context, target=target,
options=...)``, its options one :class:`~dpone_dagster.snapshot_copy.SnapshotCopyOptions`.
The asset is subsettable: materializing a subset copies just those tables (still under one
snapshot).
"""

# No `from __future__ import annotations`: Dagster reads the op's parameter annotations.
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import dagster as dg

from dpone_dagster.core.options import build_options
from dpone_dagster.dagster.events import CopyEvent
from dpone_dagster.dagster.metadata.keys.common import CommonMetadataSet
from dpone_dagster.dagster.metadata.keys.copy import CopyMetadataSet
from dpone_dagster.dagster.metadata.parts import CHECK_NAME
from dpone_dagster.dagster.resources import PostgresSourceResource, PostgresTargetResource
from dpone_dagster.dagster.run_plane.instance import check_instance_storage
from dpone_dagster.dagster.translator import CopyTableSpec, DponeTranslator, coerce_tables
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres import Sink
from dpone_dagster.snapshot_copy import SnapshotCopyOptions, Strategy


def copy_specs(
    tables: Sequence[str | CopyTableSpec | Mapping[str, Any]],
    translator: DponeTranslator,
    extra_metadata: Mapping[str, Any],
) -> list[dg.AssetSpec]:
    """The asset specs of ``tables``; refuses two tables under one key.

    Raises:
        DponeError: ``plan_invalid`` for no table, two tables copied into one target, or two
            tables mapped to one asset key.
    """
    specs = [
        translator.get_asset_spec(s).merge_attributes(metadata=dict(extra_metadata))
        for s in coerce_tables(tables)
    ]
    if len({s.key for s in specs}) != len(specs):
        raise DponeError(
            "plan_invalid", "Two tables map to one asset key.", ["Rename one through a translator."]
        )
    return specs


def snapshot_copy_assets(
    tables: Sequence[str | CopyTableSpec | Mapping[str, Any]],
    *,
    options: SnapshotCopyOptions | None = None,
    strategy: Strategy | str | None = None,
    sink: Sink | str | None = None,
    name: str | None = None,
    translator: DponeTranslator | None = None,
    group_name: str | None = None,
    pool: str | None = None,
    op_tags: Mapping[str, Any] | None = None,
    reconcile: bool = True,
    **legacy: Any,
) -> dg.AssetsDefinition:
    """One multi-asset that copies ``tables`` from the source under ONE snapshot.

    Args:
        tables: ``"schema.table"`` strings, or :class:`CopyTableSpec` (or mappings with
            ``source`` and ``target``) to copy into another name.
        options: The copy's options (:class:`~dpone_dagster.snapshot_copy.SnapshotCopyOptions`):
            ``strategy`` (``whole_copy``, ``stream_rows``, ``batched_copy``,
            ``partitioned_copy`` or ``internal_query``, source and target in one database),
            ``sink`` (``replace``, atomic; ``append``; ``merge``, by primary key), ``workers``
            of ``partitioned_copy``, ``batch_size`` (rows per range of ``batched_copy``) and
            ``schema_changes`` (``evolve``: an existing target takes added columns, widened
            types and keeps dropped columns, in the load's transaction, listed under
            ``dpone/schema_changes``; ``freeze``: any difference fails the run with
            ``schema_change_incompatible``, nothing written).
        strategy: Shortcut for ``options.strategy``.
        sink: Shortcut for ``options.sink``.
        name: The op's name (``snapshot_copy`` by default).
        translator: Maps each table to its asset spec (key ``[schema, table]`` by default).
        group_name: The asset group of every table.
        pool: Dagster concurrency pool limiting steps that read the source.
        op_tags: Tags of the op.
        reconcile: Declare the ``dpone_reconciled`` check of every table: after the load, the
            target is compared with the source inside the copy's snapshot (``replace``: equal,
            proven by row versions where the load vouched for every row, else by count and
            content digest; ``merge``/keyed ``append``: every snapshot row present and equal;
            unkeyed ``append``: counts).
        **legacy: ``workers``, ``batch_size`` and ``schema_changes`` as keywords: deprecated
            (``options=SnapshotCopyOptions(...)``), for one release.

    Returns:
        A subsettable multi-asset (resource keys ``source`` and ``target``).
        Each table depends on its source table's external asset (see
        :func:`~dpone_dagster.source_asset_specs`); each materialization carries
        ``dagster/table_name``, ``dagster/column_schema`` (read from the target's catalog after
        the commit) and ``dagster/column_lineage``. The definition carries no column schema:
        reading a catalog when definitions load would make loading need a reachable database.

    Raises:
        DponeError: at definition time: ``identifier_invalid`` for a bad name,
            ``copy_options_invalid`` for an unknown strategy or sink, ``plan_invalid`` for two
            tables copied into one target.

    Examples:
        .. code-block:: python

            shop = snapshot_copy_assets(
                ["shop.customers", "shop.orders", 'shop."Order Items"'],
                options=SnapshotCopyOptions(strategy="partitioned_copy", workers=2),
            )
    """
    how = build_options(
        SnapshotCopyOptions, options, caller="snapshot_copy_assets",
        shortcuts={"strategy": strategy, "sink": sink}, legacy=legacy,
    )  # fmt: skip
    check_instance_storage()
    specs = copy_specs(
        tables,
        translator or DponeTranslator(),
        {**CopyMetadataSet(strategy=how.strategy.value), **CommonMetadataSet(sink=how.sink.value)},
    )
    check_specs = [
        dg.AssetCheckSpec(
            CHECK_NAME,
            asset=s.key,
            description="The target equals (or contains) the source inside the copy's snapshot.",
        )
        for s in specs
        if reconcile
    ]

    @dg.multi_asset(
        name=name or "snapshot_copy",
        specs=specs,
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
    ) -> Iterator[CopyEvent]:
        yield from source.copy_tables(context, target=target, options=how)

    return _snapshot_copy
