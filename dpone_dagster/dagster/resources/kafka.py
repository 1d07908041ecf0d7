"""The Kafka source's resource: a Kafka cluster, and the event iterator ``copy_topic``.

:func:`~dpone_dagster.kafka_copy_asset` is thin over
``kafka.copy_topic(context, target=target, ledger=ledger, topic=..., target_table=...,
options=...)``: one run of the stream ``topic -> table``, its offsets committed in the ledger with
its rows, its options one :class:`~dpone_dagster.sources.KafkaCopyOptions`. Secrets (the SASL
password) come from ``EnvVar``.
"""

from __future__ import annotations

from typing import Any

import dagster as dg
from pydantic import BaseModel, Field, field_validator

from dpone_dagster.core.options import build_options
from dpone_dagster.dagster.events.kafka_copy import KafkaCopyEvents
from dpone_dagster.dagster.failures import dagster_failures
from dpone_dagster.postgres import TableName
from dpone_dagster.postgres.target_plan import Sink
from dpone_dagster.sources import KafkaCopyOptions, KafkaSettings, KafkaSource

from .ledger import LedgerResource
from .postgres import PostgresTargetResource
from .secrets import SecretResource, warn_if_literal


class KafkaSourceResource(SecretResource):
    """A Kafka cluster to read topics from (a literal ``sasl_password`` warns: pass it with
    ``dg.EnvVar``).

    Examples:
        >>> kafka = KafkaSourceResource(bootstrap_servers="broker:9092")
        >>> kafka.settings().label
        'kafka://broker:9092'
    """

    bootstrap_servers: str = Field(
        description="host:port[,host:port...]; EnvVar('KAFKA_BOOTSTRAP')."
    )
    security_protocol: str = Field(
        default="PLAINTEXT", description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."
    )
    sasl_mechanism: str | None = Field(
        default=None, description="PLAIN, SCRAM-SHA-256, SCRAM-SHA-512... (SASL protocols)."
    )
    sasl_username: str | None = Field(default=None, description="The SASL user.")
    sasl_password: str | None = Field(
        default=None, description="The SASL password; pass EnvVar('KAFKA_PASSWORD').", repr=False
    )
    ssl_ca_location: str | None = Field(
        default=None, description="CA bundle verifying the brokers' certificates (TLS)."
    )
    timeout: float = Field(
        default=30.0, gt=0, description="Seconds to wait for metadata, offsets and messages."
    )

    @field_validator("sasl_password", mode="before")
    @classmethod
    def _literal_password(cls, value: Any) -> Any:
        warn_if_literal(
            cls.__name__, "sasl_password", value, holds_secret=bool(value),
            ways_out="pass it with dg.EnvVar('KAFKA_PASSWORD')",
        )  # fmt: skip
        return value

    def settings(self) -> KafkaSettings:
        """The domain settings these fields describe."""
        return KafkaSettings(
            bootstrap_servers=self.bootstrap_servers,
            security_protocol=self.security_protocol,
            sasl_mechanism=self.sasl_mechanism,
            sasl_username=self.sasl_username,
            sasl_password=self.sasl_password,
            ssl_ca_location=self.ssl_ca_location,
            timeout=self.timeout,
        )

    def copy_topic(
        self,
        context: dg.AssetExecutionContext,
        *,
        target: PostgresTargetResource,
        ledger: LedgerResource,
        topic: str,
        target_table: str | TableName,
        options: KafkaCopyOptions | None = None,
        sink: Sink | str | None = None,
        model: type[BaseModel] | None = None,
        **legacy: Any,
    ) -> KafkaCopyEvents:
        """Runs the stream ``topic -> target_table`` once; yields the asset's materialization.

        Args:
            context: The asset's execution context (an asset of one key).
            target: The PostgreSQL target.
            ledger: The ledger (in the target's database: the offsets commit with the rows).
            topic: The topic.
            target_table: The PostgreSQL table (``schema.table``).
            options: The copy's options (:class:`~dpone_dagster.sources.KafkaCopyOptions`, as
                :func:`~dpone_dagster.kafka_copy_asset` takes them).
            sink: Shortcut for ``options.sink``.
            model: Shortcut for ``options.model``.
            **legacy: The other options as keywords (``value_format``, ``consumer_group``,
                ``max_messages_per_run``, ``dead_letter_table``, ``on_lost_offsets``,
                ``schema_changes``): deprecated (``options=KafkaCopyOptions(...)``), for one
                release.

        Returns:
            The run's events; iterating them runs it.

        Raises:
            DponeFailure: ``kafka_options_invalid`` for bad options (when called), any run error
                (while the events are iterated), with its code and next actions.

        Examples:
            .. code-block:: python

                @dg.asset
                def clicks(context, kafka: KafkaSourceResource, target: PostgresTargetResource,
                           ledger: LedgerResource):
                    yield from kafka.copy_topic(
                        context, target=target, ledger=ledger, topic="clicks",
                        target_table="events.clicks",
                    )
        """
        with dagster_failures():
            chosen = build_options(
                KafkaCopyOptions, options, caller="copy_topic",
                shortcuts={"sink": sink, "model": model}, legacy=legacy,
            )  # fmt: skip
            table = (
                target_table
                if isinstance(target_table, TableName)
                else TableName.parse(target_table)
            )
            source = KafkaSource(self.settings(), topic, chosen, target=table)
            return KafkaCopyEvents(
                context, source=source, target=target.database, ledger=ledger.config(target),
                target_table=table,
            )  # fmt: skip
