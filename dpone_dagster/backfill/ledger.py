"""The durable backfill ledger: PostgreSQL tables for runs, batch receipts and range checks.

By default the ledger is the schema ``dpone_ledger`` of the TARGET database, and every function
here runs on the caller's connection inside the caller's transaction: the copier writes a
batch's rows, inserts its receipt and advances the run (compare-and-swap on the revision) in ONE
target transaction, so a crash leaves either all three or none.

The run row holds a constant-size document; receipts are one row per batch (so a checkpoint
costs the same at the millionth row as at the first) and no per-record copy of the data is kept:
a batch's content is bound into its receipt by the hash of its COPY stream.

Concurrency: :meth:`Ledger.lock_run` takes a transaction-scoped advisory lock per run, so two
orchestrators on one run serialize batch by batch; the revision compare-and-swap in
:meth:`Ledger.save_run` is the second wall: progress can never be overwritten by an older state.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import psycopg
from psycopg import IsolationLevel, sql
from psycopg.types.json import Jsonb
from pydantic import ValidationError

from dpone_dagster.postgres import check_dsn, check_identifier

from .errors import BackfillError, backfill_error
from .protocol import BackfillRun, BatchReceipt
from .reconcile_model import ReconciliationReport
from .rules import run_integrity_is_valid
from .sessions import transaction
from .waits import wait_while

Conn = psycopg.Connection[tuple[object, ...]]

DEFAULT_LEDGER_SCHEMA = "dpone_ledger"


@dataclass(frozen=True)
class LedgerConfig:
    """Where the ledger lives.

    Attributes:
        dsn: ``None`` (the default) puts the ledger in the target database, where a batch's rows
            and its receipt commit in one transaction. A DSN puts it elsewhere (explicitly
            chosen): the batch then commits on the target first and its receipt second, and a
            crash between the two is repaired by replay (the rows are found present and equal
            and counted as duplicates; see the README).
        schema: The ledger's schema (any legal identifier).
    """

    dsn: str | None = None
    schema: str = DEFAULT_LEDGER_SCHEMA

    def __post_init__(self) -> None:
        check_identifier(self.schema, what="ledger schema")
        if self.dsn is not None:
            check_dsn(self.dsn)

    @property
    def in_target(self) -> bool:
        """True when the ledger shares the target's transactions."""
        return self.dsn is None


_RUNS = """CREATE TABLE IF NOT EXISTS {runs} (
    run_id text PRIMARY KEY,
    revision bigint NOT NULL CHECK (revision >= 1),
    run_digest text NOT NULL,
    status text NOT NULL,
    run_json jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
)"""

_RECEIPTS = """CREATE TABLE IF NOT EXISTS {receipts} (
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
)"""

_CHECKS = """CREATE TABLE IF NOT EXISTS {checks} (
    run_id text NOT NULL REFERENCES {runs} (run_id),
    sequence bigint NOT NULL,
    outcome text NOT NULL,
    code text,
    check_json jsonb NOT NULL,
    checked_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (run_id, sequence)
)"""


class Ledger:
    """Reads and writes the ledger tables on a given connection (the caller owns transactions).

    Args:
        schema: The ledger schema's exact name.
    """

    def __init__(self, schema: str = DEFAULT_LEDGER_SCHEMA) -> None:
        self.schema = check_identifier(schema, what="ledger schema")
        self.runs = sql.Identifier(schema, "backfill_runs")
        self.receipts_table = sql.Identifier(schema, "backfill_batch_receipts")
        self.checks = sql.Identifier(schema, "backfill_range_checks")

    def _sql(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(
            runs=self.runs, receipts=self.receipts_table, checks=self.checks
        )

    def ensure(self, conn: Conn) -> None:
        """Creates the schema and tables if missing, in a transaction of its own.

        Idempotent and safe when several processes start at once: creation is serialized by an
        advisory lock (``CREATE ... IF NOT EXISTS`` alone can still collide in the catalog).
        """
        with transaction(conn, IsolationLevel.READ_COMMITTED, read_only=False):
            _advisory_xact_lock(conn, "dpone_ledger_ddl:" + self.schema)
            conn.execute(
                sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema))
            )
            for ddl in (_RUNS, _RECEIPTS, _CHECKS):
                conn.execute(self._sql(ddl))

    @staticmethod
    def lock_run(conn: Conn, run_id: str) -> None:
        """Takes the run's advisory lock until the current transaction ends (waits if held)."""
        _advisory_xact_lock(conn, run_id)

    def fetch_run(self, conn: Conn, run_id: str) -> BackfillRun | None:
        """The stored run, verified, or ``None`` when the ledger has no such run.

        Raises:
            BackfillError: ``backfill_persistence_failed`` for an unreadable document,
                ``backfill_run_invalid`` for one that fails the integrity rule.
        """
        row = conn.execute(
            self._sql("SELECT revision, run_json FROM {runs} WHERE run_id = %s"), (run_id,)
        ).fetchone()
        if row is None:
            return None
        try:
            run = BackfillRun.model_validate(row[1])
        except ValidationError as exc:
            raise backfill_error(
                "backfill_persistence_failed",
                f"Stored run {run_id} is unreadable: {exc.error_count()} validation errors.",
                ["Restore the ledger row from a backup of the last integrity-valid revision."],
            ) from None
        if run.revision != row[0] or not run_integrity_is_valid(run):
            raise backfill_error("backfill_run_invalid", f"Stored run {run_id} does not verify.")
        return run

    def runs_in_progress(self, conn: Conn) -> list[BackfillRun]:
        """Every run that committed a batch and has not finished (any scope)."""
        rows = conn.execute(
            self._sql("SELECT run_id FROM {runs} WHERE status = 'in_progress' ORDER BY run_id")
        ).fetchall()
        return [run for (run_id,) in rows if (run := self.fetch_run(conn, str(run_id)))]

    def insert_run(self, conn: Conn, run: BackfillRun) -> BackfillRun:
        """Stores a new run unless one with its id exists; returns the stored one."""
        conn.execute(
            self._sql(
                "INSERT INTO {runs} (run_id, revision, run_digest, status, run_json)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (run_id) DO NOTHING"
            ),
            (run.run_id, run.revision, run.run_digest, run.status.value, _json(run)),
        )
        stored = self.fetch_run(conn, run.run_id)
        assert stored is not None
        return stored

    def save_run(self, conn: Conn, before: BackfillRun, after: BackfillRun) -> None:
        """Replaces ``before`` with ``after`` if the stored revision is still ``before``'s.

        Raises:
            BackfillError: ``backfill_checkpoint_stale`` when another revision was stored.
        """
        cur = conn.execute(
            self._sql(
                "UPDATE {runs} SET revision = %s, run_digest = %s, status = %s, run_json = %s,"
                " updated_at = clock_timestamp() WHERE run_id = %s AND revision = %s"
            ),
            (
                after.revision,
                after.run_digest,
                after.status.value,
                _json(after),
                before.run_id,
                before.revision,
            ),
        )
        if cur.rowcount != 1:
            raise backfill_error(
                "backfill_checkpoint_stale",
                f"Run {before.run_id} is no longer at revision {before.revision}.",
            )

    def fetch_receipt(self, conn: Conn, run_id: str, batch_id: str) -> BatchReceipt | None:
        """The committed receipt of ``batch_id``, if any."""
        row = conn.execute(
            self._sql("SELECT receipt_json FROM {receipts} WHERE run_id = %s AND batch_id = %s"),
            (run_id, batch_id),
        ).fetchone()
        return None if row is None else BatchReceipt.model_validate(row[0])

    def record_batch(
        self, conn: Conn, before: BackfillRun, after: BackfillRun, receipt: BatchReceipt
    ) -> None:
        """Inserts the receipt and advances the run (compare-and-swap), in the open transaction."""
        seen = receipt.observation
        conn.execute(
            self._sql(
                "INSERT INTO {receipts} (run_id, sequence, batch_id, batch_digest,"
                " previous_checkpoint, checkpoint, last_cursor, copied_count, duplicate_count,"
                " content_hash, receipt_json) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
            ),
            (
                receipt.run_id,
                receipt.sequence,
                receipt.batch_id,
                receipt.batch_digest,
                receipt.previous_checkpoint,
                receipt.checkpoint,
                seen.last_cursor,
                seen.copied_count,
                seen.duplicate_count,
                seen.content_hash,
                _json(receipt),
            ),
        )
        self.save_run(conn, before, after)

    def receipts(self, conn: Conn, run_id: str) -> list[BatchReceipt]:
        """Every receipt of the run, in sequence order."""
        rows = conn.execute(
            self._sql("SELECT receipt_json FROM {receipts} WHERE run_id = %s ORDER BY sequence"),
            (run_id,),
        ).fetchall()
        return [BatchReceipt.model_validate(r[0]) for r in rows]

    def record_checks(self, conn: Conn, report: ReconciliationReport) -> None:
        """Stores each range check of ``report`` (the newest check of a range replaces older)."""
        with conn.cursor() as cur:
            cur.executemany(
                self._sql(
                    "INSERT INTO {checks} (run_id, sequence, outcome, code, check_json)"
                    " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (run_id, sequence) DO UPDATE"
                    " SET outcome = excluded.outcome, code = excluded.code,"
                    " check_json = excluded.check_json, checked_at = clock_timestamp()"
                ),
                _check_rows(report),
            )


def wait_for_backend_exit(
    conn: Conn, pid: int, timeout: float = 30.0, interval: float = 0.02
) -> None:
    """Waits until server backend ``pid`` is gone (its transaction has committed or aborted).

    Used after a lost COMMIT response: until the old session has ended, the ledger cannot yet
    tell whether the batch committed.

    Args:
        conn: A session on the ledger's server.
        pid: The backend of the session whose COMMIT response was lost.
        timeout: Seconds to wait.
        interval: Seconds between two looks at ``pg_stat_activity``.

    Raises:
        BackfillError: ``backfill_persistence_failed`` naming the backend when it is still there
            after ``timeout`` seconds.
    """

    def running() -> list[tuple[object, ...]]:
        return conn.execute("SELECT pid FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchall()

    def still_running(_: Sequence[tuple[object, ...]]) -> BackfillError:
        return backfill_error(
            "backfill_persistence_failed",
            f"The ledger session whose COMMIT response was lost (server backend {pid}) was still "
            f"running after {timeout:g}s, so whether its batch committed is not known yet.",
            [
                f"Wait for backend {pid} to end (or end it with pg_terminate_backend({pid})), "
                "then run again: a batch whose receipt committed is answered by replay, any "
                "other is copied again.",
            ],
        )

    wait_while(running, timeout=timeout, interval=interval, timed_out=still_running)


def _advisory_xact_lock(conn: Conn, key: str) -> None:
    # psycopg has no API for advisory locks: a transaction-scoped one, released at its end.
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (key,))


def _check_rows(report: ReconciliationReport) -> Iterable[tuple[object, ...]]:
    for check in report.ranges:
        yield (report.run_id, check.sequence, check.outcome.value, check.code, _json(check))


def _json(model: BackfillRun | BatchReceipt | object) -> Jsonb:
    dump = getattr(model, "model_dump", None)
    return Jsonb(dump(mode="json") if dump is not None else model)
