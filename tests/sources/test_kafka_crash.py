"""``kill -9`` of a Kafka stream's process at random moments: no message lost, none loaded twice.

The child (``tests/helpers/crash_child.py``, engine ``kafka``) copies a topic of three partitions
into ``events.clicks`` in runs of at most 100 messages; it is killed at a random moment (while
fetching, staging, applying or committing) twelve times, each time resuming from what the ledger
holds. After every kill, the target holds for each partition exactly the offsets below the
ledger's next offset (the rows and the offsets committed together or not at all); a final run
finishes the topic, each message loaded exactly once.
"""

from __future__ import annotations

import random

from dpone_dagster.embedded_kafka import KafkaBroker
from tests.helpers import kafka
from tests.helpers.crash import kill_at, start_child
from tests.helpers.pg import fetch_all, open_transactions, staging_tables

MESSAGES = 9000
PARTITIONS = 3


def _state(dsn: str, topic: str) -> tuple[dict[int, int], dict[int, list[int]]]:
    """The ledger's next offset per partition and the offsets the target holds; a child killed
    before it created the ledger or the table left neither (both empty)."""
    [(has_ledger, exists)] = fetch_all(
        dsn,
        "SELECT to_regclass('dpone_ledger.kafka_offsets')::text, "
        "to_regclass('events.clicks')::text",
    )
    ledger = (
        {
            int(str(p)): int(str(o))
            for p, o in fetch_all(
                dsn,
                "SELECT partition, next_offset FROM dpone_ledger.kafka_offsets WHERE topic = %s",
                (topic,),
            )
        }
        if has_ledger
        else {}
    )
    loaded: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    if exists:
        for p, o in fetch_all(
            dsn, "SELECT kafka_partition, kafka_offset FROM events.clicks ORDER BY 1, 2"
        ):
            loaded[int(str(p))].append(int(str(o)))
    return ledger, loaded


def test_kill_9_at_random_moments_loses_no_message_and_loads_none_twice(
    kafka_broker: KafkaBroker, topic: str, target_dsn: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    kafka.create_topic(bootstrap, topic, PARTITIONS)
    kafka.spread(bootstrap, topic, kafka.json_messages(0, MESSAGES), PARTITIONS)
    rng = random.Random(28)
    source = f"{bootstrap}/{topic}"
    outcomes = []
    for _ in range(12):
        child = start_child("kafka", source, target_dsn, 100)
        outcomes.append(kill_at(child, "timer", 1, rng, timer=1.0))
        ledger, loaded = _state(target_dsn, topic)
        for p in range(PARTITIONS):
            assert loaded[p] == list(range(ledger.get(p, 0))), (p, ledger)
        assert staging_tables(target_dsn) == []
    assert outcomes.count("killed") >= 10, outcomes
    child = start_child("kafka", source, target_dsn, 1000)
    assert child.wait(120) == 0
    ledger, loaded = _state(target_dsn, topic)
    per_partition = MESSAGES // PARTITIONS
    assert ledger == dict.fromkeys(range(PARTITIONS), per_partition)
    assert loaded == {p: list(range(per_partition)) for p in range(PARTITIONS)}
    ids = fetch_all(target_dsn, "SELECT (value->>'id')::int AS i FROM events.clicks ORDER BY i")
    assert [int(str(i)) for (i,) in ids] == list(range(MESSAGES))
    assert open_transactions(target_dsn) == []
