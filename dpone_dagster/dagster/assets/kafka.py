"""``kafka_copy_asset``: an asset whose materialization is one run of a Kafka stream.

The asset copies a topic into a PostgreSQL table: each materialization reads, per partition,
from the offset the ledger holds up to the end the broker reported when it began (or
``max_messages_per_run``), and commits the rows and the new offsets in one target transaction.
A thin factory over :meth:`~dpone_dagster.KafkaSourceResource.copy_topic`: names and options (one
:class:`~dpone_dagster.sources.KafkaCopyOptions`) are checked when the definitions load, and the
body is ``yield from kafka.copy_topic(context, ..., options=...)``.
Schedule it (or a sensor) to keep the table current; a run with nothing new commits nothing new.
"""

# No `from __future__ import annotations`: Dagster reads the asset's parameter annotations.
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import dagster as dg
from pydantic import BaseModel

from dpone_dagster.core.options import build_options
from dpone_dagster.dagster.events import KafkaCopyEvent
from dpone_dagster.dagster.metadata.freshness import (
    freshness_check_spec,
    stream_freshness_policy,
)
from dpone_dagster.dagster.metadata.keys.common import CommonMetadataSet
from dpone_dagster.dagster.metadata.keys.kafka import KafkaMetadataSet
from dpone_dagster.dagster.run_plane.instance import check_instance_storage
from dpone_dagster.postgres import Sink, TableName
from dpone_dagster.sources import KafkaCopyOptions, KafkaSettings, KafkaSource


def _table(name: str | TableName) -> TableName:
    return name if isinstance(name, TableName) else TableName.parse(name)


def kafka_copy_asset(
    *,
    key: str | Sequence[str] | dg.AssetKey,
    topic: str,
    target_table: str | TableName,
    options: KafkaCopyOptions | None = None,
    sink: Sink | str | None = None,
    model: type[BaseModel] | None = None,
    source_resource_key: str = "kafka",
    target_resource_key: str = "target",
    ledger_resource_key: str = "ledger",
    group_name: str | None = None,
    op_tags: Mapping[str, Any] | None = None,
    source_key: str | Sequence[str] | dg.AssetKey | None = None,
    cron_schedule: str | None = None,
    freshness_policy: dg.FreshnessPolicy | None = None,
    **legacy: Any,
) -> dg.AssetsDefinition:
    """An asset that copies a Kafka topic into a PostgreSQL table, exactly once.

    Args:
        key: The asset key.
        topic: The topic.
        target_table: The PostgreSQL table (``schema.table``); created on the first run with the
            envelope columns (``kafka_partition``, ``kafka_offset``, ``kafka_timestamp``,
            ``kafka_key``, ``kafka_headers`` jsonb) and the value's.
        options: The copy's options (:class:`~dpone_dagster.sources.KafkaCopyOptions`):
            ``value_format`` (``json``: one ``value jsonb`` column, or ``model``'s fields;
            ``bytes``: one ``value bytea`` column), ``sink`` (``append``: every message a row,
            key ``(kafka_partition, kafka_offset)``; ``merge``: one row per ``kafka_key``, the
            latest, a tombstone deletes it), ``model`` (a pydantic model every JSON value must
            fit; its fields become columns), ``consumer_group`` (where the committed offsets
            are published for monitoring, ``dpone-<schema.table>`` by default; the ledger is
            the authority), ``max_messages_per_run`` (all partitions together),
            ``dead_letter_table`` (messages that cannot be loaded go there with their reason,
            instead of stopping the run with ``kafka_message_invalid`` /
            ``kafka_key_missing``), ``on_lost_offsets`` (``fail``: ``kafka_offsets_lost``;
            ``earliest``: restart a partition whose ledger offset the broker no longer holds
            at its earliest offset) and ``schema_changes`` (``evolve`` or ``freeze``: a model
            that gained a field).
        sink: Shortcut for ``options.sink``.
        model: Shortcut for ``options.model``.
        source_resource_key: The :class:`~dpone_dagster.KafkaSourceResource`'s key.
        target_resource_key: The :class:`~dpone_dagster.PostgresTargetResource`'s key.
        ledger_resource_key: The :class:`~dpone_dagster.LedgerResource`'s key.
        group_name: The asset's group.
        op_tags: Tags of the asset's op.
        source_key: The asset key of the topic (an external asset you define), upstream.
        cron_schedule: The schedule the stream runs on: the asset's freshness policy is derived
            from it (warn when the data is 1.5 intervals old, fail at 2) unless
            ``freshness_policy`` is given.
        freshness_policy: The asset's Dagster freshness policy. With either option the asset
            carries the ``dpone_fresh`` check, judging the policy by the lag each run reports
            (``dpone/lag_seconds``: from the start of the run's read, whose end offsets the
            target now holds).
        **legacy: The other options as keywords (``value_format``, ``consumer_group``,
            ``max_messages_per_run``, ``dead_letter_table``, ``on_lost_offsets``,
            ``schema_changes``): deprecated (``options=KafkaCopyOptions(...)``), for one
            release.

    Raises:
        DponeError: at definition time, for a bad table name, sink, value format, model or
            option (``kafka_options_invalid``, ``copy_options_invalid``,
            ``rest_type_unmappable``).

    Examples:
        >>> clicks = kafka_copy_asset(key="clicks", topic="clicks", target_table="events.clicks")
        >>> clicks.key.to_user_string()
        'clicks'
    """
    table = _table(target_table)
    # Every option is checked now (no broker is asked): a bad one fails when definitions load.
    chosen = build_options(
        KafkaCopyOptions, options, caller="kafka_copy_asset",
        shortcuts={"sink": sink, "model": model}, legacy=legacy,
    )  # fmt: skip
    checked = KafkaSource(KafkaSettings("definitions"), topic, chosen, target=table)
    schema = dg.TableSchema(
        columns=[
            dg.TableColumn(
                c.name, c.pg_type, constraints=dg.TableColumnConstraints(nullable=c.nullable)
            )
            for c in checked.describe()
        ]
    )
    policy = stream_freshness_policy(
        cron_schedule, freshness_policy, refusal="kafka_options_invalid"
    )
    asset_key = dg.AssetKey.from_coercible(key)
    check_instance_storage()
    upstream = None if source_key is None else dg.AssetKey.from_coercible(source_key)
    dead = chosen.dead_letter_table
    metadata = {
        "dagster/column_schema": schema,
        **CommonMetadataSet(table=table.qualified, sink=chosen.sink.value),
        **KafkaMetadataSet(
            topic=topic, dead_letter_table=None if dead is None else dead.qualified
        ),
    }  # fmt: skip

    @dg.asset(
        key=asset_key,
        freshness_policy=policy,
        check_specs=[] if policy is None else [freshness_check_spec(asset_key)],
        required_resource_keys={source_resource_key, target_resource_key, ledger_resource_key},
        description=f"Kafka topic {topic} copied to {table} ({chosen.sink}), exactly once.",
        group_name=group_name,
        op_tags=op_tags,
        kinds={"kafka", "postgres"},
        metadata=metadata,
        deps=[] if upstream is None else [upstream],
    )
    def _asset(context: dg.AssetExecutionContext) -> Iterator[KafkaCopyEvent]:
        kafka = getattr(context.resources, source_resource_key)
        target = getattr(context.resources, target_resource_key)
        ledger = getattr(context.resources, ledger_resource_key)
        yield from kafka.copy_topic(
            context, target=target, ledger=ledger, topic=topic, target_table=table, options=chosen
        )

    return _asset
