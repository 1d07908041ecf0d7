"""``PostgresCopyComponent``: snapshot copies, backfills and incremental streams declared in
YAML, without Python.

.. code-block:: yaml

    type: dpone_dagster.PostgresCopyComponent
    attributes:
      source: {dsn: "{{ env.DPONE_SOURCE_DSN }}"}
      target: {dsn: "{{ env.DPONE_TARGET_DSN }}", application_name: nightly-copy}
      asset_attributes: {owners: ["team:data"], tags: {layer: raw}}
      snapshot_copies:
        - tables:
            - shop.customers
            - source: shop.orders
              attributes: {key: warehouse/orders, group_name: sales, kinds: [sales]}
            - 'shop."Order Items"'
          strategy: partitioned_copy
          workers: 2
      backfills:
        - table: events.page_views
          cursor: id
          range_partitions: {start: 0, stop: 200000, step: 50000}
          batch_size: 20000
          on_changed: repair   # rows changed after their batch: rewrite (default: fail)
          attributes: {owners: ["team:events"]}
      incremental_streams:
        - table: shop.stock
          cursor: updated_at
          deletes: hard
          cron_schedule: "*/5 * * * *"   # a schedule that materializes it
    post_processing:   # Dagster's own, for any component: here, every asset of a group
      assets:
        - target: "group:events"
          attributes: {tags: {retention: long}}

The ``source`` and ``target`` are resources resolved from YAML; a ``dsn`` of exactly
``{{ env.NAME }}`` stays an ``EnvVar``, read at run time, so no secret is written in the YAML,
the definitions or the UI. Every name is checked when the definitions load. Asset attributes
are Dagster's (``attributes`` of a table, a backfill or a stream, over the component's
``asset_attributes``; templated, see :mod:`.attributes`);
``dg scaffold defs dpone_dagster.PostgresCopyComponent <path>`` writes a working ``defs.yaml``
to start from. The YAML of earlier versions still loads, with a ``FutureWarning`` naming the
new spelling: ``source_dsn_env``/``target_dsn_env``, and asset attributes written on an entry
itself.
"""

# No `from __future__ import annotations`: Dagster's Resolvable reads the field annotations.
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

# Dagster's asset attributes without a key, for every asset: no top-level name in dagster 1.13
# (dagster-sling's and dagster-dbt's components import from this module too).
from dagster.components.resolved.core_models import ResolvedAssetAttributes

from dpone_dagster.core import DEFAULT_LEDGER_SCHEMA
from dpone_dagster.dagster.assets.backfill import backfill_asset
from dpone_dagster.dagster.assets.incremental import incremental_asset
from dpone_dagster.dagster.assets.snapshot_copy import snapshot_copy_assets
from dpone_dagster.dagster.resources import (
    LedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
)
from dpone_dagster.dagster.translator import CopyTableSpec, source_asset_specs

from .attributes import AttributesTranslator, ResolvedSource, ResolvedTarget, resource_or_env
from .models import (
    BackfillModel,
    DailyPartitionsModel,
    IncrementalStreamModel,
    RangePartitionsModel,
    ResolvedTables,
    SnapshotCopyModel,
)
from .scaffold import PostgresCopyScaffolder, PostgresCopyScaffoldParams

__all__ = [
    "BackfillModel",
    "DailyPartitionsModel",
    "IncrementalStreamModel",
    "PostgresCopyComponent",
    "PostgresCopyScaffoldParams",
    "PostgresCopyScaffolder",
    "RangePartitionsModel",
    "ResolvedTables",
    "SnapshotCopyModel",
]


@dg.scaffold_with(PostgresCopyScaffolder)
@dataclass
class PostgresCopyComponent(dg.Component, dg.Resolvable):
    """Exposes dpone snapshot copies, partitioned backfills and incremental streams as Dagster
    assets.

    Attributes:
        source: The source database, provided as the ``source`` resource: ``dsn`` (a DSN of
            exactly ``"{{ env.NAME }}"`` stays an ``EnvVar``) and the resource's settings.
        target: The target database, provided as the ``target`` resource (and ``ledger``).
        source_dsn_env: Deprecated: ``source: {dsn: "{{ env.NAME }}"}``.
        target_dsn_env: Deprecated: ``target: {dsn: "{{ env.NAME }}"}``.
        ledger_schema: Schema of the ledger (backfill runs, streams' state) in the target database.
        key_prefix: Parts put before ``[schema, table]`` in every asset key.
        asset_attributes: Dagster's asset attributes of every asset (group, description, tags,
            kinds, owners, automation condition...); a copy's ``group_name`` and a table's own
            ``attributes`` override them.
        source_assets: Put each source table in the graph as an external asset upstream of
            its copy (on by default).
        source_key_prefix: Parts put before ``[schema, table]`` in source tables' keys.
        snapshot_copies: Sets of tables each copied under one snapshot.
        backfills: Partitioned, ledger-backed backfills.
        incremental_streams: Tables kept current run after run (each asset not partitioned,
            with an optional schedule).
    """

    source: ResolvedSource = None
    target: ResolvedTarget = None
    source_dsn_env: str | None = None
    target_dsn_env: str | None = None
    ledger_schema: str = DEFAULT_LEDGER_SCHEMA
    key_prefix: list[str] = field(default_factory=list)
    asset_attributes: ResolvedAssetAttributes = field(default_factory=dict)
    source_assets: bool = True
    source_key_prefix: list[str] = field(default_factory=lambda: ["source"])
    snapshot_copies: list[SnapshotCopyModel] = field(default_factory=list)
    backfills: list[BackfillModel] = field(default_factory=list)
    incremental_streams: list[IncrementalStreamModel] = field(default_factory=list)

    def translator(
        self, group_name: str | None, per_table: Mapping[CopyTableSpec, Mapping[str, Any]]
    ) -> AttributesTranslator:
        """The translator of one copy, backfill or stream: the component's attributes, the
        group of the copy (when set) over them, and each table's own attributes over both."""
        common = dict(self.asset_attributes)
        if group_name is not None:
            common["group_name"] = group_name
        return AttributesTranslator(
            key_prefix=tuple(self.key_prefix),
            source_assets=self.source_assets,
            source_key_prefix=tuple(self.source_key_prefix),
            common=common,
            per_table=per_table,
        )

    def _copy_assets(
        self, index: int, copy: SnapshotCopyModel
    ) -> list[dg.AssetsDefinition | dg.AssetSpec]:
        renames = copy.targets or {}
        per_table: dict[CopyTableSpec, Mapping[str, Any]] = {}
        specs = []
        for entry in copy.tables:
            if isinstance(entry, str):
                specs.append(CopyTableSpec(source=entry, target=renames.get(entry)))
            else:
                specs.append(entry.spec())
                per_table[entry.spec()] = entry.all_attributes()
        translator = self.translator(copy.group_name, per_table)
        assets = snapshot_copy_assets(
            specs,
            options=copy.options(),
            name=copy.name or f"snapshot_copy_{index}",
            translator=translator,
            pool=copy.pool,
        )
        return [assets, *source_asset_specs([assets], translator)]

    def _backfill_assets(self, backfill: BackfillModel) -> list[dg.AssetsDefinition | dg.AssetSpec]:
        translator = self.translator(
            backfill.group_name, {backfill.spec(): backfill.all_attributes()}
        )
        asset = backfill_asset(
            backfill.table,
            cursor=backfill.cursor,
            partitions_def=backfill.partitions_def(),
            options=backfill.options(),
            target_table=backfill.target,
            translator=translator,
            pool=backfill.pool,
        )
        return [asset, *source_asset_specs([asset], translator)]

    def _stream_assets(
        self, stream: IncrementalStreamModel
    ) -> tuple[list[dg.AssetsDefinition | dg.AssetSpec], list[dg.ScheduleDefinition]]:
        translator = self.translator(stream.group_name, {stream.spec(): stream.all_attributes()})
        asset = incremental_asset(
            stream.table,
            cursor=stream.cursor,
            options=stream.options(),
            target_table=stream.target,
            translator=translator,
            pool=stream.pool,
            cron_schedule=stream.cron_schedule,
        )
        schedules = []
        if stream.cron_schedule is not None:
            name = f"{asset.key.to_python_identifier()}_schedule"
            schedules.append(
                dg.ScheduleDefinition(name=name, target=asset, cron_schedule=stream.cron_schedule)
            )
        return [asset, *source_asset_specs([asset], translator)], schedules

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        """Builds the assets, the source tables' external assets (unless ``source_assets`` is
        off), the incremental streams' schedules and the resources, when the databases are
        given."""
        assets: dict[dg.AssetKey, dg.AssetsDefinition | dg.AssetSpec] = {}
        built = [a for i, c in enumerate(self.snapshot_copies) for a in self._copy_assets(i, c)]
        built += [a for b in self.backfills for a in self._backfill_assets(b)]
        schedules: list[dg.ScheduleDefinition] = []
        for stream in self.incremental_streams:
            stream_assets, stream_schedules = self._stream_assets(stream)
            built += stream_assets
            schedules += stream_schedules
        for item in built:
            # A source table copied twice has one external asset.
            keys = [item.key] if isinstance(item, dg.AssetSpec) else list(item.keys)
            assets.setdefault(keys[0], item)
        return dg.Definitions(
            assets=list(assets.values()), schedules=schedules, resources=self._resources()
        )

    def _resources(self) -> dict[str, object]:
        """``source``, ``target`` and ``ledger``, for the databases the YAML gives."""
        source = resource_or_env(self.source, PostgresSourceResource, "source", self.source_dsn_env)
        target = resource_or_env(self.target, PostgresTargetResource, "target", self.target_dsn_env)
        resources: dict[str, object] = {}
        if source is not None:
            resources["source"] = source
        if target is not None:
            resources["target"] = target
            resources["ledger"] = LedgerResource(schema_name=self.ledger_schema)
        return resources
