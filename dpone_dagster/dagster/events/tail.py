"""The end of a run's events, the same for every kind of run: each target table's standard table
set read from the target's catalog once the run has committed (lineage to the source table's
asset, the source's comments), then the asset's materialization and, for a stream with a
freshness policy, its ``dpone_fresh`` check judged from that materialization.
"""

from collections.abc import Iterator, Sequence
from typing import Any

import dagster as dg

from dpone_dagster.dagster.metadata.catalog import Source, source_key_of, table_catalog_metadata
from dpone_dagster.dagster.metadata.freshness import stream_freshness
from dpone_dagster.postgres import TableName

from .databases import Database


def table_sets(
    context: dg.AssetExecutionContext,
    target: Database,
    tables: Sequence[tuple[dg.AssetKey, TableName]],
    *,
    source: Source | None = None,
    not_copied: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """The standard table set of each asset's target table, in order, in one catalog read
    (:func:`~dpone_dagster.dagster.metadata.catalog.table_catalog_metadata`): lineage to the
    asset spec's source asset, every written column but ``not_copied``, the comments of
    ``source`` (none when None); an empty set for each when the catalog cannot be read."""
    specs = context.assets_def.specs_by_key
    return table_catalog_metadata(
        target.dsn,
        target.options,
        [(table, source_key_of(specs[key]), None) for key, table in tables],
        context.log,
        not_copied=not_copied,
        source=source,
    )


def table_set(
    context: dg.AssetExecutionContext,
    target: Database,
    key: dg.AssetKey,
    table: TableName,
    *,
    source: Source | None = None,
    not_copied: Sequence[str] = (),
) -> dict[str, Any]:
    """The standard table set of the asset ``key``'s target ``table`` (:func:`table_sets`)."""
    [standard] = table_sets(context, target, [(key, table)], source=source, not_copied=not_copied)
    return standard


def materialized(
    context: dg.AssetExecutionContext, key: dg.AssetKey, metadata: dict[str, Any]
) -> Iterator[dg.MaterializeResult[Any] | dg.AssetCheckResult]:
    """The asset's materialization with ``metadata``, then its ``dpone_fresh`` result when the
    run selected that check (:func:`~dpone_dagster.dagster.metadata.freshness.stream_freshness`)."""
    yield dg.MaterializeResult(asset_key=key, metadata=metadata)
    yield from stream_freshness(context, key, metadata)
