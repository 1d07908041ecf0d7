"""The Kafka source from Dagster: the resource, the asset factory, metadata, failures."""

from __future__ import annotations

import dagster as dg
import pytest
from pydantic import BaseModel

from dpone_dagster import KafkaCopyOptions, KafkaSourceResource, kafka_copy_asset
from dpone_dagster.dagster.failures import ERROR_CODE_KEY
from dpone_dagster.dagster.resources import LedgerResource, PostgresTargetResource
from dpone_dagster.dagster.resources.secrets import LiteralSecretWarning
from dpone_dagster.embedded_kafka import KafkaBroker
from dpone_dagster.lifecycle import DponeError
from tests.helpers import kafka, pg


class Click(BaseModel):
    id: int
    name: str


def _resources(broker: KafkaBroker, target_dsn: str, **kafka_fields: object) -> dict[str, object]:
    return {
        "kafka": KafkaSourceResource(bootstrap_servers=broker.bootstrap_servers, timeout=10.0,
                                     **kafka_fields),  # type: ignore[arg-type]
        "target": PostgresTargetResource(dsn=target_dsn),
        "ledger": LedgerResource(),
    }  # fmt: skip


def test_a_kafka_asset_materializes_each_message_once_with_its_offsets_in_the_metadata(
    kafka_broker: KafkaBroker, topic: str, target_dsn: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    kafka.create_topic(bootstrap, topic, 2)
    kafka.spread(bootstrap, topic, kafka.json_messages(0, 10), 2)
    kafka.produce(bootstrap, topic, [(b"bad", b'{"id": "x"}')], partition=1)
    asset = kafka_copy_asset(
        key=["events", "clicks"], topic=topic, target_table="events.clicks", model=Click,
        options=KafkaCopyOptions(dead_letter_table="events.clicks_dead"),
    )  # fmt: skip
    spec = next(iter(asset.specs))
    assert spec.metadata["dpone/topic"] == topic
    assert spec.metadata["dpone/dead_letter_table"] == "events.clicks_dead"
    assert spec.kinds == {"kafka", "postgres"}
    resources = _resources(kafka_broker, target_dsn)
    result = dg.materialize([asset], resources=resources)
    assert result.success
    metadata = result.asset_materializations_for_node("events__clicks")[0].metadata
    assert metadata["dagster/row_count"].value == 10
    assert metadata["dpone/messages"].value == 11
    assert metadata["dpone/dead_letters"].value == 1
    assert metadata["dpone/snapshot_label"].value == "no_snapshot_claim"
    receipt = metadata["dpone/extraction_receipt"].value
    assert receipt["snapshot_authority"] is None and receipt["source_token"] is None
    assert receipt["clock_authority"] == "dpone.orchestrator.utc"
    lines = {p["partition"]: p for p in metadata["dpone/kafka_partitions"].value}
    assert (lines[0]["first_offset"], lines[0]["last_offset"]) == (0, 4)
    assert (lines[1]["first_offset"], lines[1]["last_offset"]) == (0, 5)
    assert metadata["dpone/stream_id"].value == f"{topic} -> events.clicks"
    assert pg.fetch_one(target_dsn, "SELECT count(*) FROM events.clicks") == 10
    assert pg.fetch_one(target_dsn, "SELECT kafka_offset FROM events.clicks_dead") == 5
    # A second materialization reads only what is new.
    kafka.produce(bootstrap, topic, kafka.json_messages(10, 13), partition=0)
    again = dg.materialize([asset], resources=resources)
    metadata = again.asset_materializations_for_node("events__clicks")[0].metadata
    assert metadata["dpone/messages"].value == 3 and metadata["dpone/run"].value == 2
    assert pg.fetch_one(target_dsn, "SELECT count(DISTINCT id) FROM events.clicks") == 13


def test_a_failed_kafka_run_is_a_failure_with_its_code_and_no_password(
    kafka_broker: KafkaBroker, topic: str, target_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    kafka.create_topic(bootstrap, topic, 1)
    kafka.produce(bootstrap, topic, [(b"k", b"{not json")])
    asset = kafka_copy_asset(key="clicks", topic=topic, target_table="events.clicks")
    result = dg.materialize(
        [asset], resources=_resources(kafka_broker, target_dsn), raise_on_error=False
    )
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    data = failure.step_failure_data
    assert data.user_failure_data is not None
    assert data.user_failure_data.metadata[ERROR_CODE_KEY].value == "kafka_message_invalid"
    password = "kafka-secret-never-shown"
    with pytest.warns(LiteralSecretWarning) as warned:  # a literal: EnvVar is the way
        _resources(kafka_broker, target_dsn, sasl_password=password)
    assert "dg.EnvVar" in str(warned[0].message) and password not in str(warned[0].message)
    monkeypatch.setenv("DPONE_TEST_KAFKA_PASSWORD", password)
    sasl = _resources(
        kafka_broker, target_dsn, security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512", sasl_username="u",
        sasl_password=dg.EnvVar("DPONE_TEST_KAFKA_PASSWORD"),
    )  # fmt: skip
    refused = dg.materialize([asset], resources=sasl, raise_on_error=False)
    [failure] = [e for e in refused.all_events if e.event_type_value == "STEP_FAILURE"]
    data = failure.step_failure_data
    assert data.user_failure_data is not None
    assert data.user_failure_data.metadata[ERROR_CODE_KEY].value == "kafka_authentication_failed"
    assert password not in str(data) and password not in str(refused.all_events)


def test_bad_kafka_options_fail_when_the_definitions_load() -> None:
    with pytest.raises(DponeError) as caught:
        kafka_copy_asset(key="c", topic="t", target_table="events.clicks", sink="replace")
    assert caught.value.code == "kafka_options_invalid"
    for bad in ({"value_format": "avro"}, {"on_lost_offsets": "skip"}):
        with pytest.raises(DponeError) as caught:
            kafka_copy_asset(
                key="c", topic="t", target_table="e.c", options=KafkaCopyOptions.parse(bad)
            )
        assert caught.value.code == "kafka_options_invalid"
    with pytest.raises(DponeError) as caught:
        bytes_ = KafkaCopyOptions.parse({"value_format": "bytes"})
        kafka_copy_asset(key="c", topic="t", target_table="e.c", options=bytes_, model=Click)
    assert caught.value.code == "kafka_options_invalid"
