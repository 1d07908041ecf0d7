"""The ledger's schema: every table of the one durable ledger, and the one way it is brought up
to date.

The ledger is one PostgreSQL schema (``dpone_ledger`` of the target database by default) holding
the tables of every engine: the backfill's runs, batch receipts and range checks, the incremental
streams' states and batch receipts, and ``ledger_version``, the migrations applied. Its tables
are created by migrations, applied in order by :func:`ensure_ledger`, each once, under an
advisory lock (``CREATE ... IF NOT EXISTS`` alone can still collide in the catalog when several
processes start at once). A ledger written by an earlier release (before ``ledger_version``
existed) takes migration 1 too: its statements create only what is missing.

A ledger that is current costs one read to find so: no DDL runs, and no privilege beyond
``USAGE`` on the schema and the rights on its tables is needed. ``CREATE SCHEMA`` runs only when
the schema is missing (PostgreSQL checks the database's ``CREATE`` privilege for it even when the
schema exists).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import psycopg
from psycopg import IsolationLevel, sql

from dpone_dagster.postgres import check_identifier
from dpone_dagster.postgres.catalog import ensure_schema
from dpone_dagster.postgres.connection import Connection

from .sessions import advisory_xact_lock, one_statement, transaction

DEFAULT_LEDGER_SCHEMA: Final = "dpone_ledger"
"""The ledger's schema unless one is named."""


@dataclass(frozen=True)
class LedgerTables:
    """The names of the ledger's tables in one schema, composed for SQL.

    Args:
        schema: The ledger schema's exact name (any legal identifier).
    """

    schema: str = DEFAULT_LEDGER_SCHEMA

    def __post_init__(self) -> None:
        check_identifier(self.schema, what="ledger schema")

    def table(self, name: str) -> sql.Identifier:
        """A table of the ledger's schema."""
        return sql.Identifier(self.schema, name)

    @property
    def runs(self) -> sql.Identifier:
        """Backfill runs: one constant-size document per run."""
        return self.table("backfill_runs")

    @property
    def batch_receipts(self) -> sql.Identifier:
        """Backfill batch receipts: one row per committed batch."""
        return self.table("backfill_batch_receipts")

    @property
    def range_checks(self) -> sql.Identifier:
        """The backfill reconciliation's checks: one row per batch range."""
        return self.table("backfill_range_checks")

    @property
    def streams(self) -> sql.Identifier:
        """Incremental streams: one constant-size state document per stream."""
        return self.table("incremental_streams")

    @property
    def stream_receipts(self) -> sql.Identifier:
        """Incremental batch receipts: one row per committed batch."""
        return self.table("incremental_batch_receipts")

    @property
    def kafka_offsets(self) -> sql.Identifier:
        """Kafka streams' positions: the next offset to read, per stream and partition."""
        return self.table("kafka_offsets")

    @property
    def stream_sweeps(self) -> sql.Identifier:
        """Incremental streams' rolling sweeps: where the next slice of the key starts."""
        return self.table("incremental_sweeps")

    @property
    def replication_groups(self) -> sql.Identifier:
        """Replication groups: one row per slot (its tables, phase and applied position)."""
        return self.table("replication_groups")

    @property
    def replication_sweeps(self) -> sql.Identifier:
        """Replicated tables' rolling sweeps: one position per table of a group."""
        return self.table("replication_sweeps")

    @property
    def replication_keys(self) -> sql.Identifier:
        """Replicated tables' keys applied since their last check (``UNLOGGED``)."""
        return self.table("replication_keys")

    @property
    def version(self) -> sql.Identifier:
        """The migrations applied to this ledger."""
        return self.table("ledger_version")

    def sql(self, text: str) -> sql.Composed:
        """``text`` with ``{runs}``, ``{batch_receipts}``, ``{range_checks}``, ``{streams}``,
        ``{stream_receipts}``, ``{kafka_offsets}``, ``{stream_sweeps}``,
        ``{replication_groups}``, ``{replication_sweeps}``, ``{replication_keys}`` and
        ``{version}`` replaced by the tables' names."""
        return sql.SQL(text).format(
            **{
                name: getattr(self, name)
                for name in ("runs", "batch_receipts", "range_checks", "streams",
                             "stream_receipts", "kafka_offsets", "stream_sweeps",
                             "replication_groups", "replication_sweeps", "replication_keys",
                             "version")
                if "{" + name + "}" in text
            }
        )  # fmt: skip


_MIGRATION_1: Final = (
    """CREATE TABLE IF NOT EXISTS {runs} (
    run_id text PRIMARY KEY,
    revision bigint NOT NULL CHECK (revision >= 1),
    run_digest text NOT NULL,
    status text NOT NULL,
    run_json jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
)""",
    """CREATE TABLE IF NOT EXISTS {batch_receipts} (
    run_id text NOT NULL REFERENCES {runs} (run_id),
    sequence bigint NOT NULL CHECK (sequence >= 1),
    batch_id text NOT NULL,
    batch_digest text NOT NULL,
    previous_checkpoint text,
    checkpoint text NOT NULL,
    last_cursor text,
    copied_count bigint NOT NULL,
    duplicate_count bigint NOT NULL,
    content_hash text NOT NULL,
    receipt_json jsonb NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (run_id, batch_id),
    UNIQUE (run_id, sequence),
    UNIQUE (run_id, checkpoint)
)""",
    """CREATE TABLE IF NOT EXISTS {range_checks} (
    run_id text NOT NULL REFERENCES {runs} (run_id),
    sequence bigint NOT NULL,
    outcome text NOT NULL,
    code text,
    check_json jsonb NOT NULL,
    checked_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (run_id, sequence)
)""",
    """CREATE TABLE IF NOT EXISTS {streams} (
    stream_id text PRIMARY KEY,
    revision bigint NOT NULL CHECK (revision >= 1),
    state_json jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
)""",
    """CREATE TABLE IF NOT EXISTS {stream_receipts} (
    stream_id text NOT NULL REFERENCES {streams} (stream_id),
    sequence bigint NOT NULL CHECK (sequence >= 1),
    run bigint NOT NULL,
    receipt_json jsonb NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (stream_id, sequence)
)""",
    """CREATE TABLE IF NOT EXISTS {version} (
    version integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
)""",
)
"""Every table of the first release of the ledger."""

_MIGRATION_2: Final = (
    """CREATE TABLE IF NOT EXISTS {kafka_offsets} (
    stream_id text NOT NULL,
    topic text NOT NULL,
    partition integer NOT NULL CHECK (partition >= 0),
    next_offset bigint NOT NULL CHECK (next_offset >= 0),
    run bigint NOT NULL CHECK (run >= 1),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (stream_id, partition)
)""",
)
"""The Kafka source's positions (``sources/kafka_offsets.py``): the offset after the last message
a committed run loaded, per partition; written in the transaction that loaded those messages."""

_MIGRATION_3: Final = (
    """CREATE TABLE IF NOT EXISTS {stream_sweeps} (
    stream_id text PRIMARY KEY REFERENCES {streams} (stream_id),
    sweep_json jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
)""",
)
"""The incremental check's rolling sweep (``incremental/sweep.py``): one constant-size document
per stream (the key the next slice starts after, when the sweep began, when the last one
completed), written in the final batch's transaction, with the slice it verified."""

_MIGRATION_4: Final = (
    """CREATE TABLE IF NOT EXISTS {replication_groups} (
    slot text PRIMARY KEY,
    publication text NOT NULL,
    tables jsonb NOT NULL,
    phase text NOT NULL CHECK (phase IN ('copying', 'streaming')),
    consistent_lsn pg_lsn,
    applied_lsn pg_lsn,
    applied_end_lsn pg_lsn,
    applied_commit_time timestamptz,
    transactions bigint NOT NULL DEFAULT 0 CHECK (transactions >= 0),
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
)""",
)
"""Replication from the WAL (``replication/group_state.py``): one row per group, keyed by its slot.
The row is written before the slot is created (it marks the slot as this ledger's), and its applied
position (the commit LSN of the last applied source transaction, and the end of its commit record)
commits in the same target transaction as the rows of that transaction."""

_MIGRATION_5: Final = (
    """CREATE TABLE IF NOT EXISTS {replication_sweeps} (
    stream_id text PRIMARY KEY,
    sweep_json jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
)""",
    """CREATE UNLOGGED TABLE IF NOT EXISTS {replication_keys} (
    slot text NOT NULL,
    source_table text NOT NULL,
    key text[] NOT NULL
)""",
)
"""The replication group's check (``replication/verify.py``): each table's rolling sweep
position (keyed ``<slot>:<schema.table>``), and the keys each target transaction applied (written
with its rows, read and emptied by the check). ``UNLOGGED``: appending a run's keys costs no WAL;
a crash of the target server empties it, and the keys it held are then verified by the sweep
only."""

_MIGRATION_6: Final = (
    "ALTER TABLE {replication_groups} ADD COLUMN IF NOT EXISTS source_timeline integer",
)
"""The source's timeline the group's applied position was read on (``replication/failover.py``):
a run on another timeline (the source was promoted from a standby) checks that the new history
holds everything the target applied before it goes on."""

_MIGRATION_7: Final = (
    "ALTER TABLE {streams} ADD COLUMN IF NOT EXISTS target_rows bigint CHECK (target_rows >= 0)",
)
"""The live rows of each incremental stream's target (``StreamState.target_rows``): moved by every
batch in the transaction that commits it (previous + inserted - deleted, under the state's
compare-and-swap) and re-based when a run counts the whole target anyway, so that a run reports
the target's size without counting it. NULL: not known yet (a stream of an earlier release); its
next run counts the target once."""

MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    _MIGRATION_1,
    _MIGRATION_2,
    _MIGRATION_3,
    _MIGRATION_4,
    _MIGRATION_5,
    _MIGRATION_6,
    _MIGRATION_7,
)
"""The ledger's migrations in order; migration ``n`` is ``MIGRATIONS[n - 1]``. A new table or
column is a new migration appended here, never an edit of an applied one."""
LEDGER_VERSION: Final = len(MIGRATIONS)
"""The version a current ledger is at."""


def ledger_version(conn: Connection, tables: LedgerTables) -> int:
    """The newest migration applied to the ledger (0: none, or a ledger older than versions).

    Args:
        conn: An idle autocommit session of the ledger's database.
        tables: The ledger's tables.
    """
    try:
        with one_statement(conn):
            row = conn.execute(tables.sql("SELECT max(version) FROM {version}")).fetchone()
    except psycopg.errors.UndefinedTable:
        return 0
    return int(str(row[0])) if row is not None and row[0] is not None else 0


def ensure_ledger(conn: Connection, tables: LedgerTables) -> None:
    """Brings the ledger up to :data:`LEDGER_VERSION`, creating its schema if missing.

    Idempotent and safe when several processes start at once. A current ledger costs one read.

    Args:
        conn: An idle session of the ledger's database.
        tables: The ledger's tables.
    """
    if ledger_version(conn, tables) >= LEDGER_VERSION:
        return
    with transaction(conn, IsolationLevel.READ_COMMITTED, read_only=False):
        advisory_xact_lock(conn, "dpone_ledger_ddl:" + tables.schema)
        ensure_schema(conn, tables.schema)
        applied = _applied(conn, tables)
        for number, statements in enumerate(MIGRATIONS, start=1):
            if number in applied:
                continue
            for statement in statements:
                conn.execute(tables.sql(statement))
            conn.execute(tables.sql("INSERT INTO {version} (version) VALUES (%s)"), (number,))


def _applied(conn: Connection, tables: LedgerTables) -> set[int]:
    """The migrations recorded, read under the DDL lock (none before ``ledger_version``)."""
    exists = conn.execute("SELECT to_regclass(%s)", (tables.version.as_string(conn),)).fetchone()
    if exists is None or exists[0] is None:
        return set()
    rows = conn.execute(tables.sql("SELECT version FROM {version}")).fetchall()
    return {int(str(r[0])) for r in rows}
