"""``mysql_copy_asset`` and ``rest_copy_asset``: one asset per generic source's copy.

Each builds an asset that reads a MySQL/MariaDB table or query, or an HTTP JSON API, and loads it
into a PostgreSQL target table through a staging table and a sink (``replace``, ``append``,
``merge``), like the PostgreSQL snapshot copies. A thin factory over the resource's event
iterator: it checks the names, what is read (one :class:`~dpone_dagster.sources.MySQLRead` or
:class:`~dpone_dagster.sources.RestRead`) and the options (one
:class:`~dpone_dagster.sources.SourceCopyOptions`) when the definitions load, and the asset's
body is ``yield from source.copy_table(context, target=target, target_table=..., read=...,
options=...)``
(:meth:`~dpone_dagster.MySQLSourceResource.copy_table`,
:meth:`~dpone_dagster.RestSourceResource.copy_table`). Their materializations carry
``dagster/row_count`` and the receipts under ``dpone/...``; the snapshot label is always
``no_snapshot_claim`` (a generic source makes no snapshot claim).
"""

# No `from __future__ import annotations`: Dagster reads the asset's parameter annotations.
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import dagster as dg
from pydantic import BaseModel

from dpone_dagster.dagster.events import SourceCopyEvent
from dpone_dagster.dagster.run_plane.instance import check_instance_storage
from dpone_dagster.postgres import Sink, TableName
from dpone_dagster.sources import MySQLRead, RestRead, SourceCopyOptions, model_columns
from dpone_dagster.sources.copy_options import build_source_copy


def _table_name(table: str | TableName) -> TableName:
    """The target table, parsed when the definitions load."""
    return table if isinstance(table, TableName) else TableName.parse(table)


def _copy_asset(
    *,
    key: str | Sequence[str] | dg.AssetKey,
    source_args: Mapping[str, Any],
    source_resource_key: str,
    target_resource_key: str,
    description: str,
    group_name: str | None,
    op_tags: Mapping[str, Any] | None,
    metadata: Mapping[str, Any] | None = None,
    source_key: str | Sequence[str] | dg.AssetKey | None = None,
) -> dg.AssetsDefinition:
    """The asset whose body is ``source.copy_table(context, target=target, **source_args)``,
    the resources by their keys (``source_args``: the target table, the checked read and
    options)."""
    check_instance_storage()
    upstream = None if source_key is None else dg.AssetKey.from_coercible(source_key)

    @dg.asset(
        key=dg.AssetKey.from_coercible(key),
        required_resource_keys={source_resource_key, target_resource_key},
        description=description,
        group_name=group_name,
        op_tags=op_tags,
        kinds={"postgres"},
        metadata=metadata,
        deps=[] if upstream is None else [upstream],
    )
    def _asset(context: dg.AssetExecutionContext) -> Iterator[SourceCopyEvent]:
        source = getattr(context.resources, source_resource_key)
        target = getattr(context.resources, target_resource_key)
        yield from source.copy_table(context, target=target, **source_args)

    return _asset


def mysql_copy_asset(
    *,
    key: str | Sequence[str] | dg.AssetKey,
    target_table: str | TableName,
    read: MySQLRead | None = None,
    options: SourceCopyOptions | None = None,
    table: str | None = None,
    sink: Sink | str | None = None,
    source_resource_key: str = "mysql",
    target_resource_key: str = "target",
    group_name: str | None = None,
    op_tags: Mapping[str, Any] | None = None,
    source_key: str | Sequence[str] | dg.AssetKey | None = None,
    **legacy: Any,
) -> dg.AssetsDefinition:
    """An asset that copies a MySQL/MariaDB table or query into a PostgreSQL table.

    Args:
        key: The asset key.
        target_table: The PostgreSQL table (``schema.table``, parsed as SQL reads it).
        read: What is read (:class:`~dpone_dagster.sources.MySQLRead`): ``table`` (in the
            resource's database unless ``database`` is given; only ``columns`` of it if given)
            or ``query`` (a SELECT whose rows to copy).
        options: The copy's options (:class:`~dpone_dagster.sources.SourceCopyOptions`):
            ``sink`` (``replace``, ``append`` or ``merge``), ``primary_key`` (the key of a
            target created by the copy; a ``merge`` into a new target needs one) and
            ``schema_changes`` (``evolve``: an existing target takes added columns, widened
            types and keeps dropped columns, listed under ``dpone/schema_changes``; ``freeze``:
            any difference fails with ``schema_change_incompatible``).
        table: Shortcut for ``read.table``.
        sink: Shortcut for ``options.sink``.
        source_resource_key: The :class:`MySQLSourceResource`'s key.
        target_resource_key: The :class:`~dpone_dagster.PostgresTargetResource`'s key.
        group_name: The asset's group.
        op_tags: Tags of the asset's op (e.g. a pool).
        source_key: The asset key of what is read (an external asset you define): the copy
            depends on it, and its materializations' ``dagster/column_lineage`` maps each target
            column to the same-named column of it. No lineage without one.
        **legacy: ``query``, ``database``, ``columns`` (``read=MySQLRead(...)``),
            ``primary_key`` and ``schema_changes`` (``options=SourceCopyOptions(...)``) as
            keywords: deprecated, for one release.

    Raises:
        DponeError: at definition time, for a bad target name (``identifier_invalid``), bad
            options (``copy_options_invalid``) or read (``mysql_source_invalid``).

    Examples:
        >>> orders = mysql_copy_asset(key="orders", table="orders", target_table="raw.orders")
        >>> orders.key.to_user_string()
        'orders'
        >>> recent = mysql_copy_asset(
        ...     key="recent", target_table="raw.recent",
        ...     read=MySQLRead(query="SELECT id, total FROM orders WHERE total > 0"),
        ...     options=SourceCopyOptions(sink="merge", primary_key=["id"]),
        ... )
    """
    what, chosen = build_source_copy(
        MySQLRead, read, options, caller="mysql_copy_asset",
        shortcuts={"table": table, "sink": sink}, legacy=legacy,
    )  # fmt: skip
    return _copy_asset(
        key=key,
        source_args={"target_table": _table_name(target_table), "read": what, "options": chosen},
        source_resource_key=source_resource_key,
        target_resource_key=target_resource_key,
        description=f"MySQL/MariaDB {'table ' + what.table if what.table else 'query'} copied "
        f"to {target_table} ({chosen.sink}).",
        group_name=group_name,
        op_tags=op_tags,
        source_key=source_key,
    )


def rest_copy_asset(
    *,
    key: str | Sequence[str] | dg.AssetKey,
    target_table: str | TableName,
    read: RestRead | None = None,
    options: SourceCopyOptions | None = None,
    path: str | None = None,
    model: type[BaseModel] | None = None,
    source_resource_key: str = "rest",
    target_resource_key: str = "target",
    group_name: str | None = None,
    op_tags: Mapping[str, Any] | None = None,
    source_key: str | Sequence[str] | dg.AssetKey | None = None,
    **legacy: Any,
) -> dg.AssetsDefinition:
    """An asset that copies the records of an HTTP JSON API into a PostgreSQL table.

    Every record is validated by the read's model (whose fields are the columns) before it is
    staged.

    Args:
        key: The asset key.
        target_table: The PostgreSQL table (``schema.table``).
        read: What is read (:class:`~dpone_dagster.sources.RestRead`): ``path`` (under the
            resource's base URL), ``model`` (the pydantic model of one record),
            ``records_path`` (dotted path of the record list in each body; None when the body
            is it), ``pagination`` (``PageNumberPagination``, ``CursorPagination``,
            ``NextLinkPagination`` or None for one page), ``params`` (query parameters of
            every request), ``id_field`` (the record key that names a record in a validation
            error), ``max_pages`` (refuse to read more pages than this).
        options: The copy's options (:class:`~dpone_dagster.sources.SourceCopyOptions`:
            ``sink``, ``primary_key``, ``schema_changes``; see :func:`mysql_copy_asset`).
        path: Shortcut for ``read.path``.
        model: Shortcut for ``read.model``.
        source_resource_key: The :class:`RestSourceResource`'s key.
        target_resource_key: The target resource's key.
        group_name: The asset's group.
        op_tags: Tags of the asset's op.
        source_key: The asset key of what is read (an external asset you define): the copy
            depends on it, and its materializations' ``dagster/column_lineage`` maps each target
            column to the same-named column of it. No lineage without one.
        **legacy: ``records_path``, ``pagination``, ``params``, ``id_field``, ``max_pages``
            (``read=RestRead(...)``), ``sink``, ``primary_key`` and ``schema_changes``
            (``options=SourceCopyOptions(...)``) as keywords: deprecated, for one release.

    Raises:
        DponeError: at definition time: ``rest_source_invalid`` for a bad read,
            ``rest_type_unmappable`` for a model field no column type fits,
            ``identifier_invalid`` for a bad target name, ``copy_options_invalid`` for bad
            options.

    Examples:
        >>> from dpone_dagster.sources import PageNumberPagination
        >>> class Item(BaseModel):
        ...     id: int
        ...     name: str
        >>> items = rest_copy_asset(
        ...     key="items", target_table="raw.items",
        ...     read=RestRead(
        ...         path="/items", model=Item, records_path="data",
        ...         pagination=PageNumberPagination(),
        ...     ),
        ...     options=SourceCopyOptions(primary_key=["id"]),
        ... )
        >>> items.key.to_user_string()
        'items'
    """
    what, chosen = build_source_copy(
        RestRead, read, options, caller="rest_copy_asset",
        shortcuts={"path": path, "model": model}, legacy=legacy,
    )  # fmt: skip
    # The model's columns are the target's, so the definition carries its column schema
    # before any run (the read refused an unmappable field when it was built).
    schema = dg.TableSchema(
        columns=[
            dg.TableColumn(
                c.name, c.pg_type, constraints=dg.TableColumnConstraints(nullable=c.nullable)
            )
            for c in model_columns(what.model)
        ]
    )
    return _copy_asset(
        key=key,
        source_args={"target_table": _table_name(target_table), "read": what, "options": chosen},
        source_resource_key=source_resource_key,
        target_resource_key=target_resource_key,
        description=f"HTTP JSON records of {what.path} ({what.model.__name__}) copied to "
        f"{target_table} ({chosen.sink}).",
        group_name=group_name,
        op_tags=op_tags,
        metadata={"dagster/column_schema": schema},
        source_key=source_key,
    )
