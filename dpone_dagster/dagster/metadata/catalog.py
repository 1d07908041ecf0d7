"""The standard table set of a materialization, read from the target's catalog after it commits:
``dagster/table_name``, ``dagster/column_schema`` and ``dagster/column_lineage`` (to the source
table's asset). Every asset factory's event iterator calls :func:`table_catalog_metadata`, so
every materialization of every dpone asset carries it.
"""

from collections.abc import Sequence
from typing import Any

import dagster as dg

# TableMetadataSet has no public name in dagster 1.13 (dagster.TableMetadataSet is absent):
# this is the module Dagster's own integrations import it from.
from dagster._core.definitions.metadata import TableMetadataSet

from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres import ConnectionOptions, TableName
from dpone_dagster.postgres.table_description import (
    TableComments,
    TableDescription,
    describe_tables,
    table_comments,
)

from .keys.common import CommonMetadataSet

Source = tuple[str, ConnectionOptions | None, Sequence[TableName]]
"""Where the comments come from: the source's DSN, its options and each table's source table."""


def table_schema(
    description: TableDescription, comments: TableComments | None = None
) -> dg.TableSchema:
    """The ``dagster/column_schema`` of a table: types, nullability and constraints, and each
    column's source comment as its description.

    A constraint on one column shows on that column (a primary key or unique constraint as
    ``unique``, every constraint's definition under ``other``); constraints over several
    columns show at the table level.
    """
    own: dict[str, list[str]] = {}
    unique: set[str] = set()
    table_level: list[str] = []
    for constraint in description.constraints:
        if len(constraint.columns) != 1:
            table_level.append(constraint.definition)
            continue
        [name] = constraint.columns
        own.setdefault(name, []).append(constraint.definition)
        if constraint.kind in ("primary_key", "unique"):
            unique.add(name)
    columns = []
    for column in description.columns:
        other = list(own.get(column.name, []))
        if column.generation_sql is not None:
            other.append(f"GENERATED ALWAYS AS ({column.generation_sql}) STORED")
        elif column.default_sql is not None:
            other.append(f"DEFAULT {column.default_sql}")
        constraints = dg.TableColumnConstraints(
            nullable=not column.not_null, unique=column.name in unique, other=other
        )
        described = None if comments is None else comments.columns.get(column.name)
        columns.append(
            dg.TableColumn(
                column.name, column.type_sql, description=described, constraints=constraints
            )
        )
    return dg.TableSchema(columns=columns, constraints=dg.TableConstraints(other=table_level))


def column_lineage(columns: Sequence[str], source_key: dg.AssetKey) -> dg.TableColumnLineage:
    """Each target column comes from the source column of the same name."""
    deps = {c: [dg.TableColumnDep(asset_key=source_key, column_name=c)] for c in columns}
    return dg.TableColumnLineage(deps_by_column=deps)


def source_key_of(spec: dg.AssetSpec) -> dg.AssetKey | None:
    """The source table's asset key: the spec's one upstream dependency (None without one)."""
    deps = [d.asset_key for d in spec.deps]
    return deps[0] if len(deps) == 1 else None


def table_catalog_metadata(
    dsn: str,
    options: ConnectionOptions | None,
    tables: Sequence[tuple[TableName, dg.AssetKey | None, Sequence[str] | None]],
    log: Any = None,
    not_copied: Sequence[str] = (),
    source: Source | None = None,
) -> list[dict[str, Any]]:
    """The standard table set of each target table, read from the target's catalog.

    Args:
        dsn: The target database.
        options: Its connection options.
        tables: For each table: the target table, its source's asset key (no lineage when
            None) and the copied columns (the target's written columns when None).
        log: Where a catalog that cannot be read is reported; the copy has committed by then,
            so the materialization is still reported, without the table set.
        not_copied: Target columns no source column feeds (a soft-delete marker): no lineage.
        source: The PostgreSQL source, whose ``COMMENT ON`` texts become the column schema's
            descriptions and ``dpone/description`` (none when None).

    Returns:
        One ``dagster/table_name`` + ``dagster/column_schema`` (+ ``dagster/column_lineage``,
        ``dpone/description``) mapping per table, in order.
    """
    try:
        descriptions = describe_tables(dsn, [t for t, _, _ in tables], options)
        comments: list[TableComments | None] = [None] * len(tables)
        if source is not None:
            comments = list(table_comments(source[0], source[2], source[1]))
    except DponeError as exc:
        if log is not None:
            log.warning(f"dpone: the tables' catalog could not be read ({exc.code}): {exc}")
        return [{} for _ in tables]
    result = []
    for description, comment, (_, source_key, copied) in zip(
        descriptions, comments, tables, strict=True
    ):
        written = [c.name for c in description.columns if not c.generated]
        columns = copied or [c for c in written if c not in not_copied]
        lineage = None if source_key is None else column_lineage(columns, source_key)
        metadata = TableMetadataSet(
            table_name=description.qualified_name,
            column_schema=table_schema(description, comment),
            column_lineage=lineage,
        )
        described = CommonMetadataSet(description=None if comment is None else comment.table)
        result.append({**metadata, **described})
    return result
