"""``PostgresCopyComponent``: snapshot copies and backfills declared in YAML, without Python.

.. code-block:: yaml

    type: dpone_dagster.PostgresCopyComponent
    attributes:
      source_dsn_env: DPONE_SOURCE_DSN
      target_dsn_env: DPONE_TARGET_DSN
      snapshot_copies:
        - tables: [shop.customers, shop.orders, 'shop."Order Items"']
          strategy: partitioned_copy
          workers: 2
      backfills:
        - table: events.page_views
          cursor: id
          range_partitions: {start: 0, stop: 200000, step: 50000}
          batch_size: 20000
          on_changed: repair   # rows changed after their batch: rewrite (default: fail)

DSNs are read from environment variables at run time (``EnvVar``), so no secret is written in
the YAML or shown in the UI. Every name is checked when the definitions load.
"""

# No `from __future__ import annotations`: Dagster's Resolvable reads the field annotations.
from dataclasses import dataclass, field

import dagster as dg

from dpone_dagster.assets.backfill import backfill_asset
from dpone_dagster.assets.snapshot_copy import (
    CopySchemaChanges,
    CopySink,
    CopyStrategy,
    snapshot_copy_assets,
)
from dpone_dagster.backfill import DEFAULT_BATCH_SIZE, OnChanged
from dpone_dagster.partitions import cursor_range_partitions
from dpone_dagster.resources import (
    BackfillLedgerResource,
    PostgresSourceResource,
    PostgresTargetResource,
)
from dpone_dagster.translator import CopyTableSpec, DponeTranslator


@dataclass
class SnapshotCopyModel(dg.Resolvable):
    """One snapshot copy: the tables read under one snapshot, and how.

    Attributes:
        tables: Source tables as SQL names (``shop.orders``, ``'shop."Order Items"'``).
        targets: Optional renames: source name -> target name.
        strategy: ``whole_copy``, ``stream_rows``, ``batched_copy``, ``partitioned_copy`` or
            ``internal_query``.
        sink: ``replace``, ``append`` or ``merge``.
        schema_changes: ``evolve`` (an existing target takes added columns, widened types and
            keeps dropped columns, with the data) or ``freeze`` (any difference is refused).
        workers: Worker sessions of ``partitioned_copy``.
        name: The op's name.
        group_name: The assets' group.
        pool: Concurrency pool.
    """

    tables: list[str]
    targets: dict[str, str] | None = None
    strategy: CopyStrategy = "batched_copy"
    sink: CopySink = "replace"
    schema_changes: CopySchemaChanges = "evolve"
    workers: int = 4
    name: str | None = None
    group_name: str | None = None
    pool: str | None = None


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


@dataclass
class BackfillModel(dg.Resolvable):
    """One partitioned backfill.

    Attributes:
        table: The source table.
        cursor: The column batches are ordered by.
        range_partitions: Integer cursor ranges (or ``daily_partitions`` for a timestamp).
        daily_partitions: One partition per day of a timestamp cursor.
        batch_size: Rows per committed batch.
        target: The target table (the source's name by default).
        group_name: The asset's group.
        pool: Concurrency pool.
        on_changed: ``fail`` (default) or ``repair``: what the reconciliation does with rows
            the source changed or deleted after their batch was copied (``backfill_asset``).
    """

    table: str
    cursor: str
    range_partitions: RangePartitionsModel | None = None
    daily_partitions: DailyPartitionsModel | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    target: str | None = None
    group_name: str | None = None
    pool: str | None = None
    on_changed: OnChanged = "fail"

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


@dataclass
class PostgresCopyComponent(dg.Component, dg.Resolvable):
    """Exposes dpone snapshot copies and partitioned backfills as Dagster assets.

    Attributes:
        source_dsn_env: Environment variable holding the source DSN; when set, the component
            also provides the ``source`` resource.
        target_dsn_env: Environment variable holding the target DSN (``target`` and ``ledger``).
        ledger_schema: Schema of the backfill ledger in the target database.
        key_prefix: Parts put before ``[schema, table]`` in every asset key.
        snapshot_copies: Sets of tables each copied under one snapshot.
        backfills: Partitioned, ledger-backed backfills.
    """

    source_dsn_env: str | None = None
    target_dsn_env: str | None = None
    ledger_schema: str = "dpone_ledger"
    key_prefix: list[str] = field(default_factory=list)
    snapshot_copies: list[SnapshotCopyModel] = field(default_factory=list)
    backfills: list[BackfillModel] = field(default_factory=list)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        """Builds the assets (and resources, when DSN variables are named)."""
        translator = DponeTranslator(key_prefix=tuple(self.key_prefix))
        assets: list[dg.AssetsDefinition] = []
        for index, copy in enumerate(self.snapshot_copies):
            renames = copy.targets or {}
            specs = [CopyTableSpec(source=t, target=renames.get(t)) for t in copy.tables]
            assets.append(
                snapshot_copy_assets(
                    specs,
                    strategy=copy.strategy,
                    sink=copy.sink,
                    schema_changes=copy.schema_changes,
                    workers=copy.workers,
                    name=copy.name or f"snapshot_copy_{index}",
                    translator=translator,
                    group_name=copy.group_name,
                    pool=copy.pool,
                )
            )
        for backfill in self.backfills:
            assets.append(
                backfill_asset(
                    backfill.table,
                    cursor=backfill.cursor,
                    partitions_def=backfill.partitions_def(),
                    batch_size=backfill.batch_size,
                    target_table=backfill.target,
                    translator=translator,
                    group_name=backfill.group_name,
                    pool=backfill.pool,
                    on_changed=backfill.on_changed,
                )
            )
        resources: dict[str, object] = {}
        if self.source_dsn_env:
            resources["source"] = PostgresSourceResource(dsn=dg.EnvVar(self.source_dsn_env))
        if self.target_dsn_env:
            resources["target"] = PostgresTargetResource(dsn=dg.EnvVar(self.target_dsn_env))
            resources["ledger"] = BackfillLedgerResource(schema_name=self.ledger_schema)
        return dg.Definitions(assets=assets, resources=resources)
