"""The Kafka source against a real Kafka-protocol broker (Tansu, started by the tests) and a real
PostgreSQL target: bounded runs, exactly once, keys and tombstones, bad input, partitions."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest
from confluent_kafka import Consumer, TopicPartition
from pydantic import BaseModel

from dpone_dagster.embedded_kafka import KafkaBroker, start_broker
from dpone_dagster.lifecycle import ORCHESTRATOR_UTC, TerminalOutcome
from dpone_dagster.postgres import TableName
from dpone_dagster.sources import (
    KafkaCopyOptions,
    KafkaSettings,
    KafkaSource,
    SourceError,
    SourceLoadError,
    copy_topic,
)
from tests.helpers import kafka
from tests.helpers.pg import fetch_all, fetch_one, staging_tables

TABLE = TableName("events", "clicks")


class Click(BaseModel):
    id: int
    name: str


def _settings(broker: KafkaBroker, **kwargs: object) -> KafkaSettings:
    return KafkaSettings(broker.bootstrap_servers, timeout=10.0, **kwargs)  # type: ignore[arg-type]


def _copy(broker: KafkaBroker, topic: str, dsn: str, sink: str = "append", **kwargs: object):  # type: ignore[no-untyped-def]
    target = kwargs.pop("target", TABLE)
    assert isinstance(target, TableName)
    options = KafkaCopyOptions.parse({"sink": sink, **kwargs})
    return copy_topic(KafkaSource(_settings(broker), topic, options, target=target), dsn, target)


def _ledger(dsn: str, topic: str) -> dict[int, int]:
    rows = fetch_all(
        dsn,
        "SELECT partition, next_offset FROM dpone_ledger.kafka_offsets WHERE topic = %s",
        (topic,),
    )
    return {int(str(p)): int(str(o)) for p, o in rows}


def _group_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """The offsets the consumer group ``dpone-events.clicks`` holds (monitoring)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "dpone-events.clicks"})
    try:
        wanted = [TopicPartition(topic, p) for p in range(partitions)]
        return {tp.partition: tp.offset for tp in consumer.committed(wanted, 10)}
    finally:
        consumer.close()


def _loaded(dsn: str) -> list[tuple[int, int]]:
    rows = fetch_all(dsn, "SELECT kafka_partition, kafka_offset FROM events.clicks ORDER BY 1, 2")
    return [(int(str(p)), int(str(o))) for p, o in rows]


def test_a_run_loads_every_message_once_with_an_honest_receipt_and_the_next_resumes(
    kafka_broker: KafkaBroker, topic: str, target_dsn: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    kafka.create_topic(bootstrap, topic, 2)
    kafka.spread(bootstrap, topic, kafka.json_messages(0, 40), 2)
    before = datetime.now(UTC)
    first = _copy(kafka_broker, topic, target_dsn, model=Click)
    after = datetime.now(UTC)
    assert first.load.outcome is TerminalOutcome.SUCCESS
    assert first.messages == first.load.rows_loaded == 40
    receipt = first.load.extraction_receipt
    # The orchestrator's clock; the window inside the call; no snapshot claim.
    assert receipt.clock_authority == ORCHESTRATOR_UTC
    assert receipt.snapshot_authority is None and receipt.source_token is None
    assert receipt.snapshot_acquired_at is None
    assert receipt.extraction_started_at is not None and receipt.extraction_completed_at
    assert before <= receipt.extraction_started_at <= receipt.extraction_completed_at <= after
    assert receipt.row_count == 40 and receipt.byte_count and receipt.byte_count > 40 * 20
    # Per partition: the first and last offset read, and the ledger's next offset.
    lines = {p.partition: (p.first_offset, p.last_offset, p.next_offset) for p in first.partitions}
    assert lines == {0: (0, 19, 20), 1: (0, 19, 20)}
    assert _ledger(target_dsn, topic) == {0: 20, 1: 20}
    assert fetch_one(target_dsn, "SELECT count(DISTINCT id) FROM events.clicks") == 40

    kafka.spread(bootstrap, topic, kafka.json_messages(40, 50), 2)
    second = _copy(kafka_broker, topic, target_dsn, model=Click)
    assert second.messages == 10 and second.run == first.run + 1
    assert {p.partition: (p.first_offset, p.last_offset) for p in second.partitions} == {
        0: (20, 24),
        1: (20, 24),
    }
    assert _loaded(target_dsn) == [(p, o) for p in (0, 1) for o in range(25)]
    assert fetch_one(target_dsn, "SELECT count(DISTINCT id) FROM events.clicks") == 50
    # Nothing new: an empty run moves nothing.
    third = _copy(kafka_broker, topic, target_dsn, model=Click)
    assert third.messages == 0 and len(_loaded(target_dsn)) == 50
    # The consumer group holds the ledger's offsets, written after the commit (monitoring).
    assert second.group_commit_error is None
    assert _group_offsets(bootstrap, topic, 2) == {0: 25, 1: 25}
    assert staging_tables(target_dsn) == []


def test_partition_offset_timestamp_and_key_land_in_named_columns_and_headers_as_jsonb(
    kafka_broker: KafkaBroker, topic: str, target_dsn: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    kafka.create_topic(bootstrap, topic, 1)
    headers = [("trace", b"abc"), ("bin", b"\xff\x00"), ("trace", b"def")]
    kafka.produce(bootstrap, topic, [(b"k1", b'{"a": [1, 2]}', headers), (None, b"3")])
    report = _copy(kafka_broker, topic, target_dsn)
    assert report.load.rows_loaded == 2
    rows = fetch_all(
        target_dsn,
        "SELECT kafka_partition, kafka_offset, kafka_key, kafka_headers, value, "
        "pg_typeof(kafka_timestamp)::text, pg_typeof(value)::text FROM events.clicks ORDER BY 2",
    )
    assert rows[0][:5] == (
        0, 0, "k1",
        [{"key": "trace", "value": "abc"}, {"key": "bin", "base64": "/wA="},
         {"key": "trace", "value": "def"}],
        {"a": [1, 2]},
    )  # fmt: skip
    assert rows[1][:5] == (0, 1, None, None, 3)
    assert rows[0][5:] == ("timestamp with time zone", "jsonb")


def test_merge_keeps_the_latest_value_per_key_and_a_tombstone_deletes_the_row(
    kafka_broker: KafkaBroker, topic: str, target_dsn: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    kafka.create_topic(bootstrap, topic, 1)
    kafka.produce(bootstrap, topic, kafka.json_messages(0, 30, keys=10))  # k0..k9, 3 each
    kafka.produce(
        bootstrap, topic, [(b"k3", None), (b"k4", None), (b"k4", b'{"id": 99, "name": "back"}')]
    )
    first = _copy(kafka_broker, topic, target_dsn, sink="merge", model=Click)
    assert first.load.outcome is TerminalOutcome.SUCCESS
    rows = dict(fetch_all(target_dsn, "SELECT kafka_key, id FROM events.clicks"))
    # The latest per key (ids 20..29), k3 deleted by its tombstone, k4 back after its own.
    expected = {f"k{i}": 20 + i for i in range(10) if i != 3} | {"k4": 99}
    assert rows == expected
    # A tombstone in a later run deletes a row already in the target.
    kafka.produce(bootstrap, topic, [(b"k5", None), (b"k6", b'{"id": 66, "name": "new"}')])
    second = _copy(kafka_broker, topic, target_dsn, sink="merge", model=Click)
    assert second.tombstoned == 1
    rows = dict(fetch_all(target_dsn, "SELECT kafka_key, id FROM events.clicks"))
    assert rows == {k: v for k, v in expected.items() if k != "k5"} | {"k6": 66}
    key = fetch_all(
        target_dsn,
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = 'events.clicks'::regclass "
        "AND i.indisprimary",
    )
    assert key == [("kafka_key",)]


def test_merge_without_a_key_is_kafka_key_missing_and_commits_nothing(
    kafka_broker: KafkaBroker, topic: str, target_dsn: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    kafka.create_topic(bootstrap, topic, 1)
    kafka.produce(bootstrap, topic, [*kafka.json_messages(0, 3), (None, b'{"id": 3, "name": "x"}')])
    with pytest.raises(SourceLoadError) as caught:
        _copy(kafka_broker, topic, target_dsn, sink="merge", model=Click)
    assert caught.value.code == "kafka_key_missing"
    assert f"topic {topic!r}, partition 0, offset 3" in caught.value.message
    assert caught.value.report.outcome is TerminalOutcome.ABORT
    assert _ledger(target_dsn, topic) == {}
    assert staging_tables(target_dsn) == []


def test_a_message_that_does_not_fit_the_model_stops_the_run_naming_it_nothing_committed(
    kafka_broker: KafkaBroker, topic: str, target_dsn: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    kafka.create_topic(bootstrap, topic, 2)
    kafka.spread(bootstrap, topic, kafka.json_messages(0, 10), 2)
    _copy(kafka_broker, topic, target_dsn, model=Click)
    kafka.produce(bootstrap, topic, kafka.json_messages(10, 12), partition=1)
    kafka.produce(bootstrap, topic, [(b"bad", b'{"id": "not a number", "name": 1}')], partition=1)
    for bad in ({"model": Click}, {}):  # does not fit the model / not JSON at all
        if not bad:
            kafka.produce(bootstrap, topic, [(b"worse", b"{not json")], partition=0)
        with pytest.raises(SourceLoadError) as caught:
            _copy(kafka_broker, topic, target_dsn, **bad)
        assert caught.value.code == "kafka_message_invalid"
        if bad:
            assert f"topic {topic!r}, partition 1, offset 7" in caught.value.message
            assert "does not match Click" in caught.value.message
        else:
            # Without a model, partition 1's message is JSON: partition 0's is not.
            assert f"topic {topic!r}, partition 0, offset 5" in caught.value.message
            assert "not JSON" in caught.value.message
        # Nothing of the run: not the two good messages before it, not the offsets, and the
        # consumer group (written only after a commit) still where the last commit left it.
        assert _ledger(target_dsn, topic) == {0: 5, 1: 5}
        assert _group_offsets(bootstrap, topic, 2) == {0: 5, 1: 5}
        assert fetch_one(target_dsn, "SELECT count(*) FROM events.clicks") == 10
        assert staging_tables(target_dsn) == []


def test_a_dead_letter_table_keeps_bad_messages_with_their_reason_and_the_run_goes_on(
    kafka_broker: KafkaBroker, topic: str, target_dsn: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    kafka.create_topic(bootstrap, topic, 1)
    kafka.produce(
        bootstrap, topic,
        [*kafka.json_messages(0, 2), (b"bad", b'{"id": "x"}'), (None, b"{oops"),
         *kafka.json_messages(2, 4)],
    )  # fmt: skip
    dead = TableName("events", "clicks_dead")
    report = _copy(kafka_broker, topic, target_dsn, model=Click, dead_letter_table=dead)
    assert report.load.rows_loaded == 4 and report.dead_letters == 2 and report.messages == 6
    assert fetch_one(target_dsn, "SELECT count(*) FROM events.clicks") == 4
    letters = fetch_all(
        target_dsn,
        "SELECT topic, kafka_partition, kafka_offset, kafka_key, kafka_value, code, reason "
        "FROM events.clicks_dead ORDER BY kafka_offset",
    )
    assert [(t, p, o, k, bytes(v)) for t, p, o, k, v, _, _ in letters] == [
        (topic, 0, 2, b"bad", b'{"id": "x"}'),
        (topic, 0, 3, None, b"{oops"),
    ]
    assert letters[0][5] == "kafka_message_invalid" and "does not match Click" in letters[0][6]
    assert "Invalid JSON" in letters[1][6]
    assert _ledger(target_dsn, topic) == {0: 6}
    # A rerun loads nothing twice, in either table.
    _copy(kafka_broker, topic, target_dsn, model=Click, dead_letter_table=dead)
    assert fetch_one(target_dsn, "SELECT count(*) FROM events.clicks_dead") == 2


def test_an_unknown_topic_an_unreachable_broker_and_a_refused_login_each_have_a_code(
    kafka_broker: KafkaBroker, topic: str, target_dsn: str
) -> None:
    with pytest.raises(SourceError) as caught:
        _copy(kafka_broker, "no_such_topic_" + topic, target_dsn)
    assert caught.value.code == "kafka_topic_unknown"
    down = KafkaSettings("127.0.0.1:1", timeout=2.0)
    with pytest.raises(SourceError) as caught:
        copy_topic(KafkaSource(down, topic), target_dsn, TABLE)
    assert caught.value.code == "kafka_unreachable"
    # Tansu 0.6 refuses every SCRAM login from librdkafka (the right password too): a refusal.
    password = "pa55-w0rd-never-shown"
    sasl = _settings(
        kafka_broker, security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
        sasl_username="alice", sasl_password=password,
    )  # fmt: skip
    with pytest.raises(SourceError) as caught:
        copy_topic(KafkaSource(sasl, topic), target_dsn, TABLE)
    assert caught.value.code == "kafka_authentication_failed"
    assert password not in str(caught.value) and password not in repr(sasl)
    # Nothing was written: not the table, not even the ledger.
    assert fetch_one(target_dsn, "SELECT to_regclass('events.clicks')::text") is None
    assert fetch_one(target_dsn, "SELECT to_regnamespace('dpone_ledger')::text") is None


def test_a_broker_that_reports_its_end_behind_loses_nothing_and_the_next_run_reads_the_rest(
    kafka_broker: KafkaBroker, topic: str, target_dsn: str
) -> None:
    """Tansu reports, after one batch of N records, a high watermark of the batch's base offset
    plus one (a real Kafka reports N). The run reads up to the reported end: it loads less than
    is there, commits that much, and the next run (the end now right) reads the rest."""
    bootstrap = kafka_broker.bootstrap_servers
    kafka.create_topic(bootstrap, topic, 1)
    kafka.produce(bootstrap, topic, kafka.json_messages(0, 480), partition=0, one_batch=True)
    first = _copy(kafka_broker, topic, target_dsn, model=Click)
    [line] = first.partitions
    reported = line.end_offset
    assert first.messages == reported == _ledger(target_dsn, topic)[0]
    kafka.produce(bootstrap, topic, kafka.json_messages(480, 485), partition=0)
    second = _copy(kafka_broker, topic, target_dsn, model=Click)
    assert second.partitions[0].first_offset == reported
    assert _loaded(target_dsn) == [(0, o) for o in range(485)]
    ids = fetch_all(target_dsn, "SELECT id FROM events.clicks ORDER BY id")
    assert [i for (i,) in ids] == list(range(485))


def test_max_messages_per_run_bounds_a_run_and_the_next_continues(
    kafka_broker: KafkaBroker, topic: str, target_dsn: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    kafka.create_topic(bootstrap, topic, 2)
    kafka.spread(bootstrap, topic, kafka.json_messages(0, 30), 2)
    seen = 0
    for _ in range(4):
        report = _copy(kafka_broker, topic, target_dsn, max_messages_per_run=8)
        assert report.messages <= 8
        seen += report.messages
    assert seen == 30
    assert sorted(_loaded(target_dsn)) == [(p, o) for p in (0, 1) for o in range(15)]


def test_bytes_values_land_as_bytea(kafka_broker: KafkaBroker, topic: str, target_dsn: str) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    kafka.create_topic(bootstrap, topic, 1)
    kafka.produce(bootstrap, topic, [(b"a", b"\x00\x01\xff"), (b"b", None)])
    _copy(kafka_broker, topic, target_dsn, value_format="bytes")
    rows = fetch_all(target_dsn, "SELECT kafka_key, value FROM events.clicks ORDER BY 1")
    assert [(k, None if v is None else bytes(v)) for k, v in rows] == [
        ("a", b"\x00\x01\xff"), ("b", None)
    ]  # fmt: skip


def test_partitions_added_between_runs_are_picked_up(
    kafka_broker: KafkaBroker, topic: str, target_dsn: str
) -> None:
    """Tansu refuses CreatePartitions: the topic is rebuilt with the same messages at the same
    offsets in partitions 0 and 1 plus a third partition, which is what adding one does."""
    bootstrap = kafka_broker.bootstrap_servers
    messages = kafka.json_messages(0, 20)
    kafka.create_topic(bootstrap, topic, 2)
    kafka.spread(bootstrap, topic, messages, 2)
    _copy(kafka_broker, topic, target_dsn, model=Click)
    kafka.delete_topic(bootstrap, topic)
    kafka.create_topic(bootstrap, topic, 3)
    kafka.spread(bootstrap, topic, messages, 2)
    kafka.produce(bootstrap, topic, kafka.json_messages(20, 26), partition=2)
    kafka.produce(bootstrap, topic, kafka.json_messages(26, 28), partition=0)
    report = _copy(kafka_broker, topic, target_dsn, model=Click)
    assert {p.partition: (p.new, p.messages) for p in report.partitions} == {
        0: (False, 2),
        1: (False, 0),
        2: (True, 6),
    }
    assert _ledger(target_dsn, topic) == {0: 12, 1: 10, 2: 6}
    assert [i for (i,) in fetch_all(target_dsn, "SELECT id FROM events.clicks ORDER BY 1")] == (
        list(range(28))
    )


def test_offsets_the_broker_no_longer_holds_are_a_code_and_earliest_says_what_was_lost(
    kafka_broker: KafkaBroker, topic: str, target_dsn: str
) -> None:
    """The ledger resumes partition 0 at 10; the broker now holds offsets 0..3 of a recreated
    topic (Tansu has no DeleteRecords for a retention cut): offset 10 is gone. The sink is merge:
    an append table's key (partition, offset) would refuse a recreated topic's offsets 0..3."""
    bootstrap = kafka_broker.bootstrap_servers
    kafka.create_topic(bootstrap, topic, 1)
    kafka.produce(bootstrap, topic, kafka.json_messages(0, 10))
    _copy(kafka_broker, topic, target_dsn, "merge", model=Click)
    kafka.delete_topic(bootstrap, topic)
    kafka.create_topic(bootstrap, topic, 1)
    kafka.produce(bootstrap, topic, kafka.json_messages(100, 104))
    with pytest.raises(SourceLoadError) as caught:
        _copy(kafka_broker, topic, target_dsn, "merge", model=Click)
    assert caught.value.code == "kafka_offsets_lost"
    assert "partition 0: the ledger resumes at 10" in caught.value.message
    assert any("on_lost_offsets='earliest'" in a for a in caught.value.next_actions)
    assert _ledger(target_dsn, topic) == {0: 10}
    report = _copy(
        kafka_broker, topic, target_dsn, "merge", model=Click, on_lost_offsets="earliest"
    )
    assert report.lost == {0: (10, 0)} and report.messages == 4
    assert _ledger(target_dsn, topic) == {0: 4}
    assert fetch_one(target_dsn, "SELECT count(*) FROM events.clicks WHERE id >= 100") == 4


def test_two_runs_of_one_stream_at_once_load_each_message_once(
    kafka_broker: KafkaBroker, topic: str, target_dsn: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    kafka.create_topic(bootstrap, topic, 2)
    kafka.spread(bootstrap, topic, kafka.json_messages(0, 200), 2)
    _copy(kafka_broker, topic, target_dsn, max_messages_per_run=1)  # the table exists
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for _ in range(3):
                _copy(kafka_broker, topic, target_dsn, max_messages_per_run=40)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    _copy(kafka_broker, topic, target_dsn)
    assert _loaded(target_dsn) == [(p, o) for p in (0, 1) for o in range(100)]
    assert _ledger(target_dsn, topic) == {0: 100, 1: 100}


def test_json_that_jsonb_cannot_store_is_a_dead_letter_not_a_failed_copy(
    kafka_broker: KafkaBroker, topic: str, target_dsn: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    kafka.create_topic(bootstrap, topic, 1)
    kafka.produce(
        bootstrap, topic,
        [(None, b'{"a": 1}'), (None, b'{"a": NaN}'), (None, b'{"a": "\\u0000"}'), (None, b"[]")],
    )  # fmt: skip
    dead = TableName("events", "dead")
    report = _copy(kafka_broker, topic, target_dsn, dead_letter_table=dead)
    assert report.load.rows_loaded == 2 and report.dead_letters == 2
    reasons = fetch_all(target_dsn, "SELECT kafka_offset, reason FROM events.dead ORDER BY 1")
    assert [o for o, _ in reasons] == [1, 2]
    assert "not JSON" in reasons[0][1] and "u0000" in reasons[1][1]


def test_a_broker_lost_mid_run_is_a_code_and_nothing_of_the_run_is_committed(
    target_dsn: str,
) -> None:
    """A broker of the test's own, stopped after 10,000 rows were staged: the run waits for the
    rest up to its timeout, fails with a code, and commits neither rows nor offsets."""
    broker = start_broker()
    try:
        bootstrap = broker.bootstrap_servers
        topic = "lost_mid_run"
        kafka.create_topic(bootstrap, topic, 2)
        # More than the consumer prefetches (16 MB): the rest must come from the broker.
        big = [(f"k{i}".encode(), b'{"pad": "' + b"x" * 400 + b'"}') for i in range(100_000)]
        kafka.produce(bootstrap, topic, big, one_batch=True)
        kafka.spread(bootstrap, topic, kafka.json_messages(0, 2), 2)  # exact reported ends
        settings = KafkaSettings(bootstrap, timeout=3.0)
        source = KafkaSource(settings, topic)
        stopped: list[int] = []

        def stop_broker(rows: int) -> None:
            if not stopped:
                stopped.append(rows)
                broker.stop()

        with pytest.raises(SourceLoadError) as caught:
            copy_topic(source, target_dsn, TABLE, on_progress=stop_broker)
    finally:
        broker.stop()
    assert stopped == [10_000]
    assert caught.value.code == "kafka_unreachable", caught.value
    assert caught.value.report.outcome is TerminalOutcome.ABORT
    assert fetch_one(target_dsn, "SELECT to_regclass('events.clicks')::text") is None
    assert fetch_one(target_dsn, "SELECT count(*) FROM dpone_ledger.kafka_offsets") == 0
    assert staging_tables(target_dsn) == []
