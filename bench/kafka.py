"""Kafka source benchmark: a topic into ``append``, against the raw consume rate of the same client.

    .venv/bin/python bench/kafka.py                       # 1,000,000 messages, RSS at 1M and 3M
    .venv/bin/python bench/kafka.py --messages 200000 --rss-messages 0   # a quick look
    .venv/bin/python bench/kafka.py --json bench/results/kafka.json      # for docs/benchmarks.md

It starts the embedded broker (Tansu, ``dpone_dagster/embedded_kafka.py``), creates its own
target database on ``DPONE_TEST_PG_DSN`` (default: local postgres) and drops it. The topic has
4 partitions of JSON messages of about 200 bytes (``{"id": ..., "user": ..., "page": ...,
"ts": ..., "payload": ...}``), keyed, produced in large batches; one last single-record batch per
partition makes the broker's reported end exact (Tansu reports a batch's base offset plus one).

In one run, and in this order: the raw consume rate (confluent-kafka's ``Consumer`` assigned to
the 4 partitions, reading every message to the end into nothing), then ``copy_topic`` of the
whole topic into a fresh ``append`` table (value ``jsonb``: the messages are parsed, staged with
``COPY``, inserted, the offsets committed with them), then the raw rate again. The ratio is the
copy's messages per second over the mean of the two raw rates. Peak RSS is that of a child
process running ``copy_topic`` of the first ``--messages`` (and then of ``--rss-messages``, the
topic grown to that many) into a fresh table: the child's own ``VmHWM`` (``wait4``'s
``ru_maxrss`` would carry this parent's peak into the child: ``tests/helpers/memory.py``). With
``--json PATH`` it also writes that table, the command and the machine
(``bench/result_file.py``) for ``docs/benchmarks.py``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from bench import result_file  # noqa: E402
from dpone_dagster.embedded_kafka import start_broker  # noqa: E402
from dpone_dagster.postgres import TableName  # noqa: E402
from dpone_dagster.sources import KafkaSettings, KafkaSource, copy_topic  # noqa: E402
from tests.helpers import pg  # noqa: E402
from tests.helpers.memory import own_peak_mb  # noqa: E402

TOPIC = "bench"
PARTITIONS = 4
GOAL = 0.5
"""The copy's rate over the raw consume rate it should reach at least."""


def produce(bootstrap: str, start: int, stop: int) -> None:
    """Messages ``start..stop-1``, about 200 bytes each, round-robin over the partitions."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.num.messages": 10_000,
         "queue.buffering.max.messages": 500_000, "compression.type": "none"}
    )  # fmt: skip
    pad = "x" * 96
    for i in range(start, stop):
        value = json.dumps(
            {"id": i, "user": f"u{i % 9973}", "page": f"/p/{i % 311}", "ts": 1_700_000_000 + i,
             "payload": pad}
        ).encode()  # fmt: skip
        while True:
            try:
                producer.produce(TOPIC, key=str(i).encode(), value=value, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0
    for p in range(PARTITIONS):  # one single-record batch each: the reported end is exact
        producer.produce(TOPIC, key=b"end", value=b'{"id": -1}', partition=p)
        assert producer.flush(30) == 0


def raw_consume(bootstrap: str) -> tuple[int, float]:
    """Every message of the topic read into nothing: (messages, seconds)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench-raw", "enable.auto.commit": False,
         "enable.partition.eof": True, "queued.max.messages.kbytes": 16384}
    )  # fmt: skip
    ends = {
        p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=30)[1]
        for p in range(PARTITIONS)
    }
    started = time.perf_counter()
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    pending, count, size = set(ends), 0, 0
    while pending:
        for message in consumer.consume(10_000, timeout=1.0):
            if message.error() is not None:
                pending.discard(message.partition())
                continue
            count += 1
            size += len(message.value() or b"")
            if (message.offset() or 0) + 1 >= ends[message.partition() or 0]:
                pending.discard(message.partition())
    seconds = time.perf_counter() - started
    consumer.close()
    return count, seconds


def copy(bootstrap: str, target: str, table: str) -> tuple[int, float]:
    """``copy_topic`` of the whole topic into a fresh append table: (messages, seconds)."""
    settings = KafkaSettings(bootstrap, timeout=60.0)
    name = TableName("bench", table)
    source = KafkaSource(settings, TOPIC, target=name)
    started = time.perf_counter()
    report = copy_topic(source, target, name)
    return report.messages, time.perf_counter() - started


def rss_child(bootstrap: str, target: str, table: str) -> tuple[int, float]:
    """``copy`` in a child process: (messages, its peak RSS in MB)."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", bootstrap, target, table],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    output = proc.stdout.read()
    if proc.wait() != 0:
        raise SystemExit(f"child failed: {output}")
    messages, peak_mb = output.split()[:2]
    return int(messages), float(peak_mb)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--rss-messages", type=int, default=3_000_000, help="0: skip")
    parser.add_argument("--json", help="also write the result table there (bench/results/...)")
    parser.add_argument("--child", nargs=3, metavar=("BOOTSTRAP", "TARGET", "TABLE"))
    args = parser.parse_args()
    if args.child:
        messages, _ = copy(*args.child)
        print(messages, own_peak_mb())
        return
    broker = start_broker()
    target = pg.create_database("dpone_bench_kafka")
    began = result_file.machine(target)
    try:
        rows = measure(broker.bootstrap_servers, target, args.messages, args.rss_messages)
        if args.json:
            result_file.write(
                args.json, "kafka", began, rows, messages=args.messages, partitions=PARTITIONS,
                broker="Tansu (embedded), on the same machine",
            )  # fmt: skip
    finally:
        broker.stop()
        pg.drop_database(target)


def measure(bootstrap: str, target: str, messages: int, rss_messages: int) -> list[dict[str, Any]]:
    """Produces the topic, measures the raw consume rate, the copy and its peak RSS; prints
    each figure and returns them as the result table's rows."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
        future.result(30)
    started = time.perf_counter()
    produce(bootstrap, 0, messages)
    print(f"produced {messages:,} messages in {time.perf_counter() - started:.1f} s")
    raw1 = raw_consume(bootstrap)
    copied = copy(bootstrap, target, "copy_1")
    raw2 = raw_consume(bootstrap)
    raw_rate = (raw1[0] / raw1[1] + raw2[0] / raw2[1]) / 2
    copy_rate = copied[0] / copied[1]
    ratio = copy_rate / raw_rate
    print(f"raw consume       {raw1[0]:>10,} msgs  {raw1[0] / raw1[1]:>10,.0f} msg/s, "
          f"again {raw2[0] / raw2[1]:,.0f} msg/s")  # fmt: skip
    print(f"copy_topic append {copied[0]:>10,} msgs  {copy_rate:>10,.0f} msg/s "
          f"({copied[1]:.1f} s)")  # fmt: skip
    print(f"ratio copy / raw  {ratio:.2f}  (goal >= {GOAL})")
    rows: list[dict[str, Any]] = [
        {"measure": "raw consume (before / after the copy)", "messages": f"{raw1[0]:,}",
         "figure": f"{raw1[0] / raw1[1]:,.0f} / {raw2[0] / raw2[1]:,.0f} msg/s", "ratio": "",
         "goal": ""},
        {"measure": "copy_topic into append", "messages": f"{copied[0]:,}",
         "figure": f"{copy_rate:,.0f} msg/s ({copied[1]:.1f} s)",
         "ratio": f"{ratio:.2f} of the raw consume",
         "goal": f">= {GOAL}: {'met' if ratio >= GOAL else 'missed'}"},
    ]  # fmt: skip
    sizes = [("rss_1", messages)]
    if rss_messages > messages:
        sizes.append(("rss_3", rss_messages))
    for table, size in sizes:
        if size > messages:
            produce(bootstrap, messages, size)
        read, rss = rss_child(bootstrap, target, table)
        print(f"peak RSS copy_topic of {read:>10,} msgs  {rss:.0f} MB")
        rows.append({"measure": "peak RSS of copy_topic (a child process)",
                     "messages": f"{read:,}", "figure": f"{rss:.0f} MB", "ratio": "",
                     "goal": ""})  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
