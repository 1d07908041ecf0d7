"""The generic sources' resources: a MySQL/MariaDB server and an HTTP JSON API.

Each holds its source's settings (secrets as ``EnvVar``) and carries the event iterator
``copy_table(context, target=target, target_table=..., read=..., options=...)``: the copy of
one table, query or API resource (what is read one :class:`~dpone_dagster.sources.MySQLRead` or
:class:`~dpone_dagster.sources.RestRead`) into a PostgreSQL table, through a staging table and a
sink (its options one :class:`~dpone_dagster.sources.SourceCopyOptions`), that
:func:`~dpone_dagster.mysql_copy_asset` and :func:`~dpone_dagster.rest_copy_asset` are thin
over. A generic source makes no snapshot claim (label ``no_snapshot_claim``).
"""

from __future__ import annotations

from typing import Any

import dagster as dg
from pydantic import BaseModel, Field, field_validator

from dpone_dagster.dagster.events.source_copy import SourceCopyEvents
from dpone_dagster.dagster.failures import dagster_failures
from dpone_dagster.postgres import TableName
from dpone_dagster.postgres.target_plan import Sink
from dpone_dagster.sources import (
    MySQLRead,
    MySQLSettings,
    MySQLSource,
    RestRead,
    RestSettings,
    RestSource,
    SourceCopyOptions,
)
from dpone_dagster.sources.copy_options import build_source_copy

from .postgres import PostgresTargetResource
from .secrets import SecretResource, warn_if_literal


class MySQLSourceResource(SecretResource):
    """A MySQL or MariaDB server to read from.

    Examples:
        >>> resource = MySQLSourceResource(host="db", user="reader", database="shop")
        >>> resource.settings().label
        'mysql://reader@db:3306/shop'
    """

    host: str = Field(default="127.0.0.1", description="Server host.")
    port: int = Field(default=3306, ge=1, le=65535, description="Server port.")
    user: str = Field(description="User name.")
    password: str = Field(
        default="", description="Password; pass EnvVar('MYSQL_PASSWORD').", repr=False
    )
    database: str = Field(description="Database of the tables (and default of queries).")
    connect_timeout: float = Field(default=10.0, gt=0, description="Seconds to connect.")
    read_timeout: float | None = Field(
        default=300.0, description="Seconds to wait for each read from the server; None: forever."
    )
    fetch_size: int = Field(default=5000, ge=1, description="Rows read per fetch.")

    @field_validator("password", mode="before")
    @classmethod
    def _literal_password(cls, value: Any) -> Any:
        warn_if_literal(
            cls.__name__, "password", value, holds_secret=bool(value),
            ways_out="pass it with dg.EnvVar('MYSQL_PASSWORD')",
        )  # fmt: skip
        return value

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

    def copy_table(
        self,
        context: dg.AssetExecutionContext,
        *,
        target: PostgresTargetResource,
        target_table: str | TableName,
        read: MySQLRead | None = None,
        options: SourceCopyOptions | None = None,
        table: str | None = None,
        sink: Sink | str | None = None,
        **legacy: Any,
    ) -> SourceCopyEvents:
        """Copies a MySQL/MariaDB table or query into a PostgreSQL table; yields the asset's
        materialization.

        Args:
            context: The asset's execution context (an asset of one key).
            target: The PostgreSQL target.
            target_table: The PostgreSQL table (``schema.table``, parsed as SQL reads it).
            read: What is read (:class:`~dpone_dagster.sources.MySQLRead`, as
                :func:`~dpone_dagster.mysql_copy_asset` takes it).
            options: The copy's options (:class:`~dpone_dagster.sources.SourceCopyOptions`, as
                :func:`~dpone_dagster.mysql_copy_asset` takes them).
            table: Shortcut for ``read.table``.
            sink: Shortcut for ``options.sink``.
            **legacy: ``query``, ``database``, ``columns``, ``primary_key`` and
                ``schema_changes`` as keywords: deprecated (``read=MySQLRead(...)``,
                ``options=SourceCopyOptions(...)``), for one release.

        Returns:
            The copy's events; iterating them runs it.

        Raises:
            DponeFailure: ``mysql_source_invalid`` for a bad read, ``copy_options_invalid``
                for bad options, ``identifier_invalid`` for a bad target name (when called), any
                copy error (while the events are iterated), with its code and next actions.

        Examples:
            .. code-block:: python

                @dg.asset(deps=["mysql_orders"])
                def orders(context, mysql: MySQLSourceResource, target: PostgresTargetResource):
                    yield from mysql.copy_table(
                        context, target=target, target_table="raw.orders",
                        read=MySQLRead(table="orders"),
                    )
        """
        with dagster_failures():
            what, chosen = build_source_copy(
                MySQLRead, read, options, caller="copy_table",
                shortcuts={"table": table, "sink": sink}, legacy=legacy,
            )  # fmt: skip
            return SourceCopyEvents(
                context, source=MySQLSource(self.settings(), what), target=target.database,
                target_table=_table_name(target_table), options=chosen,
            )  # fmt: skip


class RestSourceResource(SecretResource):
    """An HTTP JSON API to read from.

    Examples:
        >>> RestSourceResource(base_url="https://api.example.com/v1").settings().timeout
        30.0
    """

    base_url: str = Field(description="The API's root URL.")
    headers: dict[str, str] = Field(
        default_factory=dict, description="Headers for every request.", repr=False
    )
    bearer_token: str | None = Field(
        default=None,
        description="Sent as 'Authorization: Bearer ...'; pass EnvVar('API_TOKEN').",
        repr=False,
    )
    timeout: float = Field(default=30.0, gt=0, description="Seconds per connect/read/write.")
    max_retries: int = Field(default=5, ge=0, description="Retries after a 429, 5xx or error.")
    backoff_seconds: float = Field(default=0.5, ge=0, description="First retry's wait.")
    max_backoff_seconds: float = Field(
        default=30.0, ge=0, description="Longest wait between attempts (caps Retry-After)."
    )

    @field_validator("bearer_token", mode="before")
    @classmethod
    def _literal_token(cls, value: Any) -> Any:
        warn_if_literal(
            cls.__name__, "bearer_token", value, holds_secret=bool(value),
            ways_out="pass it with dg.EnvVar('API_TOKEN')",
        )  # fmt: skip
        return value

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

    def copy_table(
        self,
        context: dg.AssetExecutionContext,
        *,
        target: PostgresTargetResource,
        target_table: str | TableName,
        read: RestRead | None = None,
        options: SourceCopyOptions | None = None,
        path: str | None = None,
        model: type[BaseModel] | None = None,
        **legacy: Any,
    ) -> SourceCopyEvents:
        """Copies the records of an API resource into a PostgreSQL table, each validated by
        the read's model (whose fields are the columns); yields the asset's materialization.

        Args:
            context: The asset's execution context (an asset of one key).
            target: The PostgreSQL target.
            target_table: The PostgreSQL table (``schema.table``).
            read: What is read (:class:`~dpone_dagster.sources.RestRead`, as
                :func:`~dpone_dagster.rest_copy_asset` takes it).
            options: The copy's options (:class:`~dpone_dagster.sources.SourceCopyOptions`, as
                :func:`~dpone_dagster.rest_copy_asset` takes them).
            path: Shortcut for ``read.path``.
            model: Shortcut for ``read.model``.
            **legacy: ``records_path``, ``pagination``, ``params``, ``id_field``,
                ``max_pages``, ``sink``, ``primary_key`` and ``schema_changes`` as keywords:
                deprecated (``read=RestRead(...)``, ``options=SourceCopyOptions(...)``), for
                one release.

        Returns:
            The copy's events; iterating them runs it.

        Raises:
            DponeFailure: ``rest_source_invalid`` for a bad read, ``rest_type_unmappable`` for
                a model field no column type fits, ``copy_options_invalid`` for bad options
                (when called), any copy error (while the events are iterated).

        Examples:
            .. code-block:: python

                @dg.asset
                def items(context, rest: RestSourceResource, target: PostgresTargetResource):
                    yield from rest.copy_table(
                        context, target=target, target_table="raw.items",
                        read=RestRead(
                            path="/items", model=Item, records_path="data",
                            pagination=PageNumberPagination(),
                        ),
                    )
        """
        with dagster_failures():
            what, chosen = build_source_copy(
                RestRead, read, options, caller="copy_table",
                shortcuts={"path": path, "model": model}, legacy=legacy,
            )  # fmt: skip
            return SourceCopyEvents(
                context, source=RestSource(self.settings(), what), target=target.database,
                target_table=_table_name(target_table), options=chosen,
            )  # fmt: skip


def _table_name(table: str | TableName) -> TableName:
    """The target table, parsed where a caller's text enters."""
    return table if isinstance(table, TableName) else TableName.parse(table)
