"""A Kafka topic's copy as events: ``kafka.copy_topic(context, target=target, ledger=ledger, ...)``.

One run of the stream ``topic -> table`` (:func:`~dpone_dagster.sources.copy_topic`): from the
offsets the ledger holds to the end the broker reported when the run began (or the run's budget),
the rows and the new offsets committed in one target transaction. The materialization carries
``dagster/row_count``, the receipt (no snapshot claim: ``no_snapshot_claim``), and under
``dpone/`` the topic, the stream, the run, the messages, each partition's first and last offset
read, the dead letters and any offsets given up; an asset with a freshness policy also gets the
``dpone_fresh`` check, judged by the run's ``dpone/lag_seconds``.
"""

import json
from collections.abc import Iterator
from dataclasses import KW_ONLY, dataclass
from typing import Any

import dagster as dg

from dpone_dagster.core.errors import engine_error
from dpone_dagster.core.ledger import LedgerConfig
from dpone_dagster.dagster.events.source_copy import report_metadata
from dpone_dagster.dagster.metadata.keys.common import CommonMetadataSet
from dpone_dagster.dagster.metadata.keys.kafka import KafkaMetadataSet
from dpone_dagster.dagster.metadata.parts import log_schema_changes
from dpone_dagster.postgres import TableName
from dpone_dagster.sources import KafkaCopyReport, KafkaSource, copy_topic

from .databases import Database
from .skeleton import JobEvents
from .tail import materialized, table_set

KafkaCopyEvent = dg.MaterializeResult[Any] | dg.AssetCheckResult


def kafka_metadata(report: KafkaCopyReport) -> dict[str, Any]:
    """The materialization metadata of a Kafka run (figures as numbers)."""
    lost = {str(p): list(gap) for p, gap in report.lost.items()}
    return {
        **report_metadata(report.load),
        **CommonMetadataSet(
            stream_id=report.stream_id, run=report.run, rows_deleted=report.tombstoned
        ),
        **KafkaMetadataSet(
            topic=report.topic,
            messages=report.messages,
            dead_letters=report.dead_letters,
            kafka_partitions=dg.MetadataValue.json([p.as_json() for p in report.partitions]),
            offsets_lost=dg.MetadataValue.json(lost) if lost else None,
            group_commit_error=report.group_commit_error,
        ),
    }


@dataclass(frozen=True)
class KafkaCopyEvents(JobEvents[KafkaCopyEvent]):
    """The events of one run of a Kafka stream: iterating them runs it.

    :meth:`~dpone_dagster.KafkaSourceResource.copy_topic` returns one; ``source`` is the
    adapter it built (the topic and the copy's options), the other attributes its arguments as
    plain values (the target's database, the ledger's settings).
    """

    context: dg.AssetExecutionContext
    _: KW_ONLY
    source: KafkaSource
    target: Database
    ledger: LedgerConfig
    target_table: TableName

    def run(self) -> Iterator[KafkaCopyEvent]:
        """Runs the stream once; yields the asset's materialization (``kafka_options_invalid``
        for a ledger outside the target's database: the offsets commit with the rows)."""
        context, target, table = self.context, self.target, self.target_table
        if not self.ledger.in_target:
            raise engine_error(
                "kafka_options_invalid",
                "A Kafka stream's offsets commit with its rows: the ledger resource names "
                "another database than the target's.",
                ["Leave LedgerResource.dsn unset, or give it the target's database."],
            )
        report = copy_topic(
            self.source, target.dsn, table, ledger_schema=self.ledger.schema,
            connection_options=target.options,
        )  # fmt: skip
        log_schema_changes(context.log, table.qualified, report.load.schema_changes)
        lines = json.dumps([p.as_json() for p in report.partitions])
        context.log.info(
            f"dpone: {report.messages} messages of {report.topic} into {table} (run "
            f"{report.run}, {report.load.rows_loaded} rows, {report.dead_letters} dead letters); "
            f"partitions {lines}"
        )
        for partition, (resume, restart) in report.lost.items():
            what = (
                f"offsets {resume}..{restart - 1} were deleted by retention and are not in {table}"
                if restart > resume
                else "the topic was recreated: messages of the old topic after that offset are "
                f"not in {table}"
            )
            context.log.warning(
                f"dpone: partition {partition} of {report.topic}: the ledger's offset {resume} "
                f"was no longer on the broker; restarted at {restart} ({what})."
            )
        standard = table_set(context, target, context.asset_key, table)
        yield from materialized(context, context.asset_key, {**kafka_metadata(report), **standard})
