"""Dagster wiring for the generic sources: resources for their settings, one asset per copy.

``mysql_copy_asset`` and ``rest_copy_asset`` build an asset that reads a MySQL/MariaDB table or
query, or an HTTP JSON API, and loads it into a PostgreSQL target table through a staging table
and a sink (``replace``, ``append``, ``merge``), like the PostgreSQL snapshot copies. Their
materializations carry ``dagster/row_count`` and the receipts under ``dpone/...``; the snapshot
label is always ``no_snapshot_claim`` (a generic source makes no snapshot claim).
"""

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dagster as dg
from pydantic import BaseModel, Field

from dpone_dagster.catalog_metadata import table_catalog_metadata
from dpone_dagster.failures import dagster_failures
from dpone_dagster.instance import check_instance_storage
from dpone_dagster.metadata import (
    log_schema_changes,
    rate_metadata,
    schema_change_metadata,
)
from dpone_dagster.postgres import TableName
from dpone_dagster.postgres.plan import Sink, check_sink
from dpone_dagster.postgres.schema_change import SchemaChanges, check_schema_changes
from dpone_dagster.resources import PostgresTargetResource
from dpone_dagster.sources import (
    MySQLSettings,
    MySQLSource,
    Pagination,
    RestSettings,
    RestSource,
    SourceAdapter,
    SourceLoadReport,
    load_source,
    model_columns,
)


class MySQLSourceResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """A MySQL or MariaDB server to read from.

    Examples:
        >>> resource = MySQLSourceResource(host="db", user="reader", database="shop")
        >>> resource.settings().label
        'mysql://reader@db:3306/shop'
    """

    host: str = Field(default="127.0.0.1", description="Server host.")
    port: int = Field(default=3306, ge=1, le=65535, description="Server port.")
    user: str = Field(description="User name.")
    password: str = Field(default="", description="Password; pass EnvVar('MYSQL_PASSWORD').")
    database: str = Field(description="Database of the tables (and default of queries).")
    connect_timeout: float = Field(default=10.0, gt=0, description="Seconds to connect.")
    read_timeout: float | None = Field(
        default=300.0, description="Seconds to wait for each read from the server; None: forever."
    )
    fetch_size: int = Field(default=5000, ge=1, description="Rows read per fetch.")

    def settings(self) -> MySQLSettings:
        """The domain settings these fields describe."""
        return MySQLSettings(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password,
            database=self.database,
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            fetch_size=self.fetch_size,
        )


class RestSourceResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """An HTTP JSON API to read from.

    Examples:
        >>> RestSourceResource(base_url="https://api.example.com/v1").settings().timeout
        30.0
    """

    base_url: str = Field(description="The API's root URL.")
    headers: dict[str, str] = Field(default_factory=dict, description="Headers for every request.")
    bearer_token: str | None = Field(
        default=None, description="Sent as 'Authorization: Bearer ...'; pass EnvVar('API_TOKEN')."
    )
    timeout: float = Field(default=30.0, gt=0, description="Seconds per connect/read/write.")
    max_retries: int = Field(default=5, ge=0, description="Retries after a 429, 5xx or error.")
    backoff_seconds: float = Field(default=0.5, ge=0, description="First retry's wait.")
    max_backoff_seconds: float = Field(
        default=30.0, ge=0, description="Longest wait between attempts (caps Retry-After)."
    )

    def settings(self) -> RestSettings:
        """The domain settings these fields describe."""
        headers = dict(self.headers)
        if self.bearer_token:
            headers["Authorization"] = f"Bearer {self.bearer_token}"
        return RestSettings(
            base_url=self.base_url,
            headers=headers,
            timeout=self.timeout,
            max_retries=self.max_retries,
            backoff_seconds=self.backoff_seconds,
            max_backoff_seconds=self.max_backoff_seconds,
        )


def report_metadata(report: SourceLoadReport) -> dict[str, Any]:
    """The materialization metadata of a generic load (figures as numbers)."""
    receipt = report.extraction_receipt
    rates = rate_metadata(
        report.rows_loaded or 0,
        receipt.byte_count,
        receipt.extraction_started_at,
        receipt.extraction_completed_at,
    )
    return {
        **rates,
        "dagster/row_count": dg.MetadataValue.int(report.rows_loaded or 0),
        "dpone/source": dg.MetadataValue.text(report.source_label),
        "dpone/sink": dg.MetadataValue.text(report.sink),
        "dpone/sink_method": dg.MetadataValue.text(report.sink_method or "-"),
        "dpone/terminal_outcome": dg.MetadataValue.text(report.outcome.value),
        "dpone/snapshot_label": dg.MetadataValue.text(report.snapshot_label.value),
        "dpone/extraction_receipt": dg.MetadataValue.json(json.loads(receipt.model_dump_json())),
        **schema_change_metadata(report.schema_changes),
    }


def _copy_asset(
    *,
    key: str | Sequence[str] | dg.AssetKey,
    target_table: str | TableName,
    sink: Sink,
    schema_changes: SchemaChanges,
    primary_key: Sequence[str],
    source_resource_key: str,
    target_resource_key: str,
    build_source: Callable[[Any], SourceAdapter],
    description: str,
    group_name: str | None,
    op_tags: Mapping[str, Any] | None,
    metadata: Mapping[str, Any] | None = None,
    source_key: str | Sequence[str] | dg.AssetKey | None = None,
) -> dg.AssetsDefinition:
    target = target_table if isinstance(target_table, TableName) else TableName.parse(target_table)
    check_sink(sink)
    check_instance_storage()
    check_schema_changes(schema_changes)
    asset_key = dg.AssetKey.from_coercible(key)
    upstream = None if source_key is None else dg.AssetKey.from_coercible(source_key)

    @dg.asset(
        key=asset_key,
        required_resource_keys={source_resource_key, target_resource_key},
        description=description,
        group_name=group_name,
        op_tags=op_tags,
        kinds={"postgres"},
        metadata=metadata,
        deps=[] if upstream is None else [upstream],
    )
    def _asset(context: dg.AssetExecutionContext) -> dg.MaterializeResult:  # type: ignore[type-arg]
        target_resource: PostgresTargetResource = getattr(context.resources, target_resource_key)
        source = build_source(getattr(context.resources, source_resource_key))
        with dagster_failures():
            report = load_source(
                source,
                target_resource.dsn,
                target,
                sink=sink,
                primary_key=primary_key,
                options=target_resource.options,
                schema_changes=schema_changes,
            )
        log_schema_changes(context.log, target.qualified, report.schema_changes)
        context.log.info(
            f"dpone: {report.rows_loaded} rows from {report.source_label} into {target} "
            f"({report.sink_method}); outcome {report.outcome.value}"
        )
        [standard] = table_catalog_metadata(
            target_resource.dsn, target_resource.options, [(target, upstream, None)], context.log
        )
        return dg.MaterializeResult(metadata={**report_metadata(report), **standard})

    return _asset


def mysql_copy_asset(
    *,
    key: str | Sequence[str] | dg.AssetKey,
    target_table: str | TableName,
    table: str | None = None,
    query: str | None = None,
    database: str | None = None,
    columns: Sequence[str] | None = None,
    sink: Sink = Sink.REPLACE,
    primary_key: Sequence[str] = (),
    schema_changes: SchemaChanges = SchemaChanges.EVOLVE,
    source_resource_key: str = "mysql",
    target_resource_key: str = "target",
    group_name: str | None = None,
    op_tags: Mapping[str, Any] | None = None,
    source_key: str | Sequence[str] | dg.AssetKey | None = None,
) -> dg.AssetsDefinition:
    """An asset that copies a MySQL/MariaDB table or query into a PostgreSQL table.

    Args:
        key: The asset key.
        target_table: The PostgreSQL table (``schema.table``, parsed as SQL reads it).
        table: The MySQL table (give ``table`` or ``query``).
        query: A SELECT whose rows to copy.
        database: The table's database when it is not the resource's.
        columns: Copy only these columns of ``table``.
        sink: ``replace``, ``append`` or ``merge``.
        primary_key: The key of a target created by the copy (required for ``merge``).
        schema_changes: ``evolve`` (an existing target takes added columns, widened types and
            keeps dropped columns, listed under ``dpone/schema_changes``) or ``freeze`` (any
            difference fails with ``schema_change_incompatible``).
        source_resource_key: The :class:`MySQLSourceResource`'s key.
        target_resource_key: The :class:`~dpone_dagster.resources.PostgresTargetResource`'s key.
        group_name: The asset's group.
        op_tags: Tags of the asset's op (e.g. a pool).
        source_key: The asset key of what is read (an external asset you define): the copy
            depends on it, and its materializations' ``dagster/column_lineage`` maps each target
            column to the same-named column of it. No lineage without one.

    Raises:
        DponeError: at definition time, for a bad target name, sink or source spec.

    Examples:
        >>> orders = mysql_copy_asset(key="orders", table="orders", target_table="raw.orders")
        >>> orders.key.to_user_string()
        'orders'
    """
    if (table is None) == (query is None):
        MySQLSource(MySQLSettings(), table=table, query=query)  # raises mysql_source_invalid

    def build(resource: MySQLSourceResource) -> SourceAdapter:
        return MySQLSource(
            resource.settings(), table=table, query=query, database=database, columns=columns
        )

    return _copy_asset(
        key=key,
        target_table=target_table,
        sink=sink,
        schema_changes=schema_changes,
        primary_key=primary_key,
        source_resource_key=source_resource_key,
        target_resource_key=target_resource_key,
        build_source=build,
        description=f"MySQL/MariaDB {'table ' + table if table else 'query'} copied to "
        f"{target_table} ({sink}).",
        group_name=group_name,
        op_tags=op_tags,
        source_key=source_key,
    )


def rest_copy_asset(
    *,
    key: str | Sequence[str] | dg.AssetKey,
    target_table: str | TableName,
    path: str,
    model: type[BaseModel],
    records_path: str | None = None,
    pagination: Pagination | None = None,
    params: Mapping[str, object] | None = None,
    id_field: str = "id",
    max_pages: int | None = None,
    sink: Sink = Sink.REPLACE,
    primary_key: Sequence[str] = (),
    schema_changes: SchemaChanges = SchemaChanges.EVOLVE,
    source_resource_key: str = "rest",
    target_resource_key: str = "target",
    group_name: str | None = None,
    op_tags: Mapping[str, Any] | None = None,
    source_key: str | Sequence[str] | dg.AssetKey | None = None,
) -> dg.AssetsDefinition:
    """An asset that copies the records of an HTTP JSON API into a PostgreSQL table.

    Every record is validated by ``model`` (whose fields are the columns) before it is staged.

    Args:
        key: The asset key.
        target_table: The PostgreSQL table (``schema.table``).
        path: The resource's path under the resource's base URL.
        model: The pydantic model of one record.
        records_path: Dotted path of the record list in each body; None when the body is it.
        pagination: ``PageNumberPagination``, ``CursorPagination``, ``NextLinkPagination`` or
            None for one page.
        params: Query parameters of every request.
        id_field: The record key that names a record in a validation error.
        max_pages: Refuse to read more pages than this.
        sink: ``replace``, ``append`` or ``merge``.
        primary_key: The key of a target created by the copy (required for ``merge``).
        schema_changes: ``evolve`` or ``freeze`` (see :func:`mysql_copy_asset`).
        source_resource_key: The :class:`RestSourceResource`'s key.
        target_resource_key: The target resource's key.
        group_name: The asset's group.
        op_tags: Tags of the asset's op.
        source_key: The asset key of what is read (an external asset you define): the copy
            depends on it, and its materializations' ``dagster/column_lineage`` maps each target
            column to the same-named column of it. No lineage without one.

    Raises:
        DponeError: at definition time: ``rest_type_unmappable`` for a model field no column
            type fits, or a bad target name or sink.

    Examples:
        >>> from dpone_dagster.sources import PageNumberPagination
        >>> class Item(BaseModel):
        ...     id: int
        ...     name: str
        >>> items = rest_copy_asset(
        ...     key="items", target_table="raw.items", path="/items", model=Item,
        ...     records_path="data", pagination=PageNumberPagination(), primary_key=["id"],
        ... )
        >>> items.key.to_user_string()
        'items'
    """
    # An unmappable field fails when the definitions load; the model's columns are the
    # target's, so the definition carries its column schema before any run.
    columns = model_columns(model)
    schema = dg.TableSchema(
        columns=[
            dg.TableColumn(
                c.name, c.pg_type, constraints=dg.TableColumnConstraints(nullable=c.nullable)
            )
            for c in columns
        ]
    )

    def build(resource: RestSourceResource) -> SourceAdapter:
        return RestSource(
            resource.settings(),
            path,
            model,
            records_path=records_path,
            pagination=pagination,
            params=params,
            id_field=id_field,
            max_pages=max_pages,
        )

    return _copy_asset(
        key=key,
        target_table=target_table,
        sink=sink,
        schema_changes=schema_changes,
        primary_key=primary_key,
        source_resource_key=source_resource_key,
        target_resource_key=target_resource_key,
        build_source=build,
        description=f"HTTP JSON records of {path} ({model.__name__}) copied to {target_table} "
        f"({sink}).",
        group_name=group_name,
        op_tags=op_tags,
        metadata={"dagster/column_schema": schema},
        source_key=source_key,
    )


__all__ = [
    "MySQLSourceResource",
    "RestSourceResource",
    "mysql_copy_asset",
    "report_metadata",
    "rest_copy_asset",
]
