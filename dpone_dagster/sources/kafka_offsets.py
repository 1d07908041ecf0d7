"""What a Kafka run writes in the target besides its rows, all in the load's one transaction.

- **Offsets.** The ledger table ``kafka_offsets`` (migration 2 of
  :mod:`dpone_dagster.core.ledger_schema`) holds per stream (topic -> table) and partition the
  next offset to read. A run takes the stream's advisory lock and reads them when the load's
  transaction begins, and writes the new ones just before its COMMIT: the rows and the offsets
  commit together or not at all, and two runs of one stream serialize.
- **Dead letters.** With ``dead_letter_table=``, a message that cannot be loaded is written there
  with its coordinates, its raw key and value, its code and its reason, in the same transaction.
- **Keys and tombstones** (the ``merge`` sink): the staged messages are reduced to the latest
  per key (highest offset; a key stays in one partition under Kafka's default partitioner), and a
  key whose latest message is a tombstone (a null value) is deleted from the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from psycopg import sql

from dpone_dagster.core import LedgerStore
from dpone_dagster.postgres import TableName
from dpone_dagster.postgres.connection import Connection


@dataclass(frozen=True)
class DeadLetter:
    """A message that was not loaded, as the dead-letter table keeps it."""

    topic: str
    partition: int
    offset: int
    timestamp: datetime | None
    key: bytes | None
    value: bytes | None
    headers: str | None
    code: str
    reason: str


def stream_lock_key(stream_id: str) -> str:
    """The advisory lock's name of a Kafka stream."""
    return "dpone_kafka:" + stream_id


def read_offsets(
    conn: Connection, store: LedgerStore, stream_id: str
) -> tuple[dict[int, int], int]:
    """Takes the stream's lock (until the transaction ends) and reads its offsets.

    Returns:
        The next offset per partition the ledger holds, and the number of this run.
    """
    store.lock(conn, stream_lock_key(stream_id))
    rows = conn.execute(
        store.tables.sql(
            "SELECT partition, next_offset, run FROM {kafka_offsets} WHERE stream_id = %s"
        ),
        (stream_id,),
    ).fetchall()
    offsets = {int(str(p)): int(str(o)) for p, o, _ in rows}
    last_run = max((int(str(r)) for _, _, r in rows), default=0)
    return offsets, last_run + 1


def write_offsets(
    conn: Connection,
    store: LedgerStore,
    stream_id: str,
    topic: str,
    offsets: dict[int, int],
    run: int,
) -> None:
    """Stores the next offset of each partition the run read or found (in its transaction)."""
    if not offsets:
        return
    conn.execute(
        store.tables.sql(
            "INSERT INTO {kafka_offsets} (stream_id, topic, partition, next_offset, run) "
            "SELECT %s, %s, p, o, %s FROM unnest(%s::int[], %s::bigint[]) AS u(p, o) "
            "ON CONFLICT (stream_id, partition) DO UPDATE SET next_offset = excluded.next_offset, "
            "run = excluded.run, topic = excluded.topic, updated_at = clock_timestamp()"
        ),
        (stream_id, topic, run, list(offsets), list(offsets.values())),
    )


_DEAD_LETTER_COLUMNS = (
    ("topic", "text NOT NULL"),
    ("kafka_partition", "integer NOT NULL"),
    ("kafka_offset", "bigint NOT NULL"),
    ("kafka_timestamp", "timestamptz"),
    ("kafka_key", "bytea"),
    ("kafka_value", "bytea"),
    ("kafka_headers", "jsonb"),
    ("code", "text NOT NULL"),
    ("reason", "text NOT NULL"),
)


def write_dead_letters(conn: Connection, table: TableName, letters: Sequence[DeadLetter]) -> None:
    """Creates the dead-letter table if missing and writes ``letters`` into it."""
    if not letters:
        return
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(table.schema)))
    columns = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(kind))
        for name, kind in _DEAD_LETTER_COLUMNS
    )
    conn.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} ({}, recorded_at timestamptz NOT NULL DEFAULT "
            "clock_timestamp(), PRIMARY KEY (topic, kafka_partition, kafka_offset))"
        ).format(table.ident, columns)
    )
    names = sql.SQL(", ").join(sql.Identifier(name) for name, _ in _DEAD_LETTER_COLUMNS)
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(table.ident, names)
    with conn.cursor() as cursor, cursor.copy(statement) as copy:
        for d in letters:
            copy.write_row(
                (d.topic, d.partition, d.offset, d.timestamp, d.key, d.value, d.headers,
                 d.code, d.reason)
            )  # fmt: skip


def settle_keys(
    conn: Connection,
    staging: TableName,
    target: TableName,
    tombstones: Sequence[tuple[str, int, int]],
) -> int:
    """Keeps the latest staged message per key; deletes the keys whose latest is a tombstone.

    Args:
        conn: The load's session.
        staging: The staging table (the merge sink applies it afterwards).
        target: The target table (its rows of tombstoned keys are deleted, when it exists).
        tombstones: ``(key, partition, offset)`` of the run's tombstones.

    Returns:
        The target rows deleted by tombstones.
    """
    conn.execute(
        sql.SQL(
            "DELETE FROM {s} WHERE ctid IN (SELECT ctid FROM (SELECT ctid, row_number() OVER "
            "(PARTITION BY kafka_key ORDER BY kafka_offset DESC, kafka_partition DESC) AS n "
            "FROM {s}) AS ranked WHERE n > 1)"
        ).format(s=staging.ident)
    )
    if not tombstones:
        return 0
    keys, partitions, offsets = (list(c) for c in zip(*tombstones, strict=True))
    gone = conn.execute(
        sql.SQL(
            "DELETE FROM {} AS s USING unnest(%s::text[], %s::int[], %s::bigint[]) AS d(k, p, o) "
            "WHERE s.kafka_key = d.k AND s.kafka_partition = d.p AND s.kafka_offset = d.o "
            "RETURNING s.kafka_key"
        ).format(staging.ident),
        (keys, partitions, offsets),
    ).fetchall()
    exists = conn.execute("SELECT to_regclass(%s)", (target.qualified,)).fetchone()
    if not gone or exists is None or exists[0] is None:
        return 0
    deleted = conn.execute(
        sql.SQL("DELETE FROM {} WHERE kafka_key = ANY(%s)").format(target.ident),
        ([str(k[0]) for k in gone],),
    )
    return deleted.rowcount
