"""The backfill's records in the ledger: runs, batch receipts and range checks.

The tables are the ledger store's (:mod:`dpone_dagster.core.ledger`); this module reads them as
the backfill's documents, verified: a stored run must parse and pass the integrity rule. By
default the ledger is the schema ``dpone_ledger`` of the TARGET database, and every method runs
on the caller's connection inside the caller's transaction: the copier writes a batch's rows,
inserts its receipt and advances the run (compare-and-swap on the revision) in ONE target
transaction, so a crash leaves either all three or none.

The run row holds a constant-size document; receipts are one row per batch (so a checkpoint
costs the same at the millionth row as at the first) and no per-record copy of the data is kept:
a batch's content is bound into its receipt by the hash of its COPY stream.
"""

from __future__ import annotations

from pydantic import ValidationError

from dpone_dagster.core.errors import EngineError, engine_error
from dpone_dagster.core.ledger import LedgerStore, as_json
from dpone_dagster.core.ledger_schema import DEFAULT_LEDGER_SCHEMA
from dpone_dagster.core.waits import wait_for_backend_exit
from dpone_dagster.postgres.connection import Connection

from .backfill_documents import BackfillRun, BatchReceipt
from .range_checks import ReconciliationReport
from .run_rules import run_integrity_is_valid
from .stream_documents import StreamReceipt, StreamState


class RunLedger:
    """Reads and writes backfill runs, receipts and range checks on a given connection (the
    caller owns transactions).

    Args:
        schema: The ledger schema's exact name.
    """

    def __init__(self, schema: str = DEFAULT_LEDGER_SCHEMA) -> None:
        self.store = LedgerStore(schema)
        self.schema = schema
        tables = self.store.tables
        self._receipt = tables.sql(
            "SELECT receipt_json FROM {batch_receipts} WHERE run_id = %s AND batch_id = %s"
        )
        self._receipts = tables.sql(
            "SELECT receipt_json FROM {batch_receipts} WHERE run_id = %s ORDER BY sequence"
        )
        self._check = tables.sql(
            "INSERT INTO {range_checks} (run_id, sequence, outcome, code, check_json)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (run_id, sequence) DO UPDATE"
            " SET outcome = excluded.outcome, code = excluded.code,"
            " check_json = excluded.check_json, checked_at = clock_timestamp()"
        )

    def ensure(self, conn: Connection) -> None:
        """Brings the ledger up to date (its schema and tables created if missing)."""
        self.store.ensure(conn)

    def lock_run(self, conn: Connection, run_id: str) -> None:
        """Takes the run's advisory lock until the current transaction ends (waits if held)."""
        self.store.lock(conn, run_id)

    def fetch_run(self, conn: Connection, run_id: str) -> BackfillRun | None:
        """The stored run, verified, or ``None`` when the ledger has no such run.

        Raises:
            EngineError: ``backfill_persistence_failed`` for an unreadable document,
                ``backfill_run_invalid`` for one that fails the integrity rule.
        """
        stored = self.store.runs.fetch(conn, run_id)
        if stored is None:
            return None
        try:
            run = BackfillRun.model_validate(stored.document)
        except ValidationError as exc:
            raise engine_error(
                "backfill_persistence_failed",
                f"Stored run {run_id} is unreadable: {exc.error_count()} validation errors.",
                ["Restore the ledger row from a backup of the last integrity-valid revision."],
            ) from None
        if run.revision != stored.revision or not run_integrity_is_valid(run):
            raise engine_error("backfill_run_invalid", f"Stored run {run_id} does not verify.")
        return run

    def all_runs(self, conn: Connection) -> list[BackfillRun]:
        """Every run of the ledger (any scope), parsed."""
        return [BackfillRun.model_validate(d) for d in self.store.runs.all(conn)]

    def runs_in_progress(self, conn: Connection) -> list[BackfillRun]:
        """Every run that committed a batch and has not finished (any scope)."""
        ids = self.store.runs.keys_where(conn, "status", "in_progress")
        return [run for run_id in ids if (run := self.fetch_run(conn, run_id))]

    def insert_run(self, conn: Connection, run: BackfillRun) -> BackfillRun:
        """Stores a new run unless one with its id exists; returns the stored one."""
        self.store.runs.insert(
            conn, run.run_id, run.revision, as_json(run),
            run_digest=run.run_digest, status=run.status.value,
        )  # fmt: skip
        stored = self.fetch_run(conn, run.run_id)
        assert stored is not None
        return stored

    def save_run(self, conn: Connection, before: BackfillRun, after: BackfillRun) -> None:
        """Replaces ``before`` with ``after`` if the stored revision is still ``before``'s.

        Raises:
            EngineError: ``backfill_checkpoint_stale`` when another revision was stored.
        """
        swapped = self.store.runs.swap(
            conn, before.run_id, before.revision, after.revision, as_json(after),
            run_digest=after.run_digest, status=after.status.value,
        )  # fmt: skip
        if not swapped:
            raise engine_error(
                "backfill_checkpoint_stale",
                f"Run {before.run_id} is no longer at revision {before.revision}.",
            )

    def fetch_receipt(self, conn: Connection, run_id: str, batch_id: str) -> BatchReceipt | None:
        """The committed receipt of ``batch_id``, if any."""
        row = conn.execute(self._receipt, (run_id, batch_id)).fetchone()
        return None if row is None else BatchReceipt.model_validate(row[0])

    def record_batch(
        self, conn: Connection, before: BackfillRun, after: BackfillRun, receipt: BatchReceipt
    ) -> None:
        """Inserts the receipt and advances the run (compare-and-swap), in the open transaction."""
        seen = receipt.observation
        self.store.insert_row(
            conn,
            self.store.tables.batch_receipts,
            {
                "run_id": receipt.run_id,
                "sequence": receipt.sequence,
                "batch_id": receipt.batch_id,
                "batch_digest": receipt.batch_digest,
                "previous_checkpoint": receipt.previous_checkpoint,
                "checkpoint": receipt.checkpoint,
                "last_cursor": seen.last_cursor,
                "copied_count": seen.copied_count,
                "duplicate_count": seen.duplicate_count,
                "content_hash": seen.content_hash,
                "receipt_json": as_json(receipt),
            },
        )
        self.save_run(conn, before, after)

    def receipts(self, conn: Connection, run_id: str) -> list[BatchReceipt]:
        """Every receipt of the run, in sequence order."""
        rows = conn.execute(self._receipts, (run_id,)).fetchall()
        return [BatchReceipt.model_validate(r[0]) for r in rows]

    def record_checks(self, conn: Connection, report: ReconciliationReport) -> None:
        """Stores each range check of ``report`` (the newest check of a range replaces older)."""
        rows = [
            (report.run_id, check.sequence, check.outcome.value, check.code, as_json(check))
            for check in report.ranges
        ]
        with conn.cursor() as cur:
            cur.executemany(self._check, rows)


class StreamLedger:
    """Reads and writes stream states and receipts on a given connection (the caller owns the
    transaction), in the ledger store's tables.

    Args:
        schema: The ledger schema's exact name.
    """

    def __init__(self, schema: str = DEFAULT_LEDGER_SCHEMA) -> None:
        self.store = LedgerStore(schema)
        self.schema = schema
        self._receipts = self.store.tables.sql(
            "SELECT receipt_json FROM {stream_receipts} WHERE stream_id = %s"
            " AND (%s::bigint IS NULL OR run = %s::bigint) ORDER BY sequence"
        )

    def exists(self, conn: Connection) -> bool:
        """Whether the ledger holds the stream tables (read in ``conn``'s current transaction)."""
        tables = self.store.tables
        found = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL",
            (tables.streams.as_string(conn), tables.stream_receipts.as_string(conn)),
        ).fetchone()
        return found is not None and bool(found[0])

    def ensure(self, conn: Connection) -> None:
        """Brings the ledger up to date (its schema and tables created if missing)."""
        self.store.ensure(conn)

    def lock(self, conn: Connection, stream_id: str) -> None:
        """Takes the stream's advisory lock until the current transaction ends."""
        self.store.lock(conn, stream_id)

    def fetch(self, conn: Connection, stream_id: str) -> StreamState | None:
        """The stored state of the stream, or ``None`` when it has none yet."""
        stored = self.store.streams.fetch(conn, stream_id)
        if stored is None:
            return None
        state = StreamState.model_validate(
            {**stored.document, "target_rows": stored.later["target_rows"]}
        )
        if state.revision != stored.revision:
            raise engine_error(
                "incremental_stream_stale",
                f"The stored state of {stream_id} does not match its revision column.",
            )
        return state

    def save(self, conn: Connection, before: StreamState | None, after: StreamState) -> None:
        """Stores ``after`` if the stored revision is still ``before``'s (or none is stored).

        Raises:
            EngineError: ``incremental_stream_stale`` when another revision was stored.
        """
        streams, key, rows = self.store.streams, after.stream_id, after.target_rows
        if before is None:
            saved = streams.insert(conn, key, after.revision, as_json(after), target_rows=rows)
        else:
            saved = streams.swap(
                conn, key, before.revision, after.revision, as_json(after), target_rows=rows
            )
        if not saved:
            raise engine_error(
                "incremental_stream_stale",
                f"Stream {after.stream_id} is no longer at revision "
                f"{None if before is None else before.revision}.",
            )

    def record(
        self, conn: Connection, before: StreamState, after: StreamState, receipt: StreamReceipt
    ) -> None:
        """Inserts the batch's receipt and advances the state (compare-and-swap)."""
        self.store.insert_row(
            conn,
            self.store.tables.stream_receipts,
            {
                "stream_id": receipt.stream_id,
                "sequence": receipt.sequence,
                "run": receipt.run,
                "receipt_json": as_json(receipt),
            },
        )
        self.save(conn, before, after)

    def receipts(
        self, conn: Connection, stream_id: str, run: int | None = None
    ) -> list[StreamReceipt]:
        """The stream's receipts (of one run, when given), in sequence order."""
        rows = conn.execute(self._receipts, (stream_id, run, run)).fetchall()
        return [StreamReceipt.model_validate(r[0]) for r in rows]


def wait_for_lost_commit(conn: Connection, pid: int, timeout: float = 30.0) -> None:
    """Waits until the ledger session whose COMMIT response was lost (backend ``pid``) is gone:
    only then does the ledger say whether its batch committed.

    Raises:
        EngineError: ``backfill_persistence_failed`` naming the backend when it is still there
            after ``timeout`` seconds.
    """
    wait_for_backend_exit(conn, pid, timeout=timeout, timed_out=_commit_unknown)


def _commit_unknown(pid: int, timeout: float) -> EngineError:
    return engine_error(
        "backfill_persistence_failed",
        f"The ledger session whose COMMIT response was lost (server backend {pid}) was still "
        f"running after {timeout:g}s, so whether its batch committed is not known yet.",
        [
            f"Wait for backend {pid} to end (or end it with pg_terminate_backend({pid})), "
            "then run again: a batch whose receipt committed is answered by replay, any "
            "other is copied again.",
        ],
    )
