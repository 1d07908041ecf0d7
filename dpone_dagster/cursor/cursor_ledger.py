"""The cursor engine's one ledger facade: each policy's document and batch receipts, verified, in
the ledger store's tables.

The tables are the ledger store's (:mod:`dpone_dagster.core.ledger`), unchanged: the fixed mark
keeps one run per scope (``backfill_runs``, receipts in ``backfill_batch_receipts``, its range
checks in ``backfill_range_checks``), the moving mark one state per stream
(``incremental_streams`` with its ``target_rows`` column, receipts in
``incremental_batch_receipts``). :class:`CursorLedger` reads and writes either through the
policy's :class:`JobRecords`; :class:`RunLedger` and :class:`StreamLedger` bind it.

By default the ledger is the schema ``dpone_ledger`` of the TARGET database, and every method
runs on the caller's connection inside the caller's transaction: a batch's rows, its receipt
and the advanced document (compare-and-swap on the revision, under the job's advisory lock)
commit in ONE target transaction, so a crash leaves all three or none. The document is
constant-size; receipts are one row per batch (a checkpoint costs the same at the millionth row
as at the first), and no per-record copy of the data is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

from psycopg import sql
from pydantic import ValidationError

from dpone_dagster.core.errors import engine_error
from dpone_dagster.core.ledger import Documents, LedgerStore, as_json
from dpone_dagster.core.ledger_schema import DEFAULT_LEDGER_SCHEMA, LedgerTables
from dpone_dagster.postgres.connection import Connection

from .backfill_documents import BackfillRun, BackfillStatus, BatchReceipt
from .range_checks import ReconciliationReport
from .run_rules import run_integrity_is_valid
from .stream_documents import StreamReceipt, StreamState

D = TypeVar("D", BackfillRun, StreamState)
R = TypeVar("R", BatchReceipt, StreamReceipt)


@dataclass(frozen=True, kw_only=True)
class JobRecords(Generic[D, R]):
    """How one policy's records live in the ledger (:data:`FIXED_MARK_RECORDS`,
    :data:`MOVING_MARK_RECORDS`).

    Attributes:
        document: The document's type.
        documents: The store's table of the documents.
        columns: The row's columns beside the document, written with it.
        verify: The integrity rule a stored document must pass besides its revision column
            (``None``: the revision column alone).
        unreadable: The code of a stored document that does not parse (``None``: the parse
            error itself is raised).
        unverified: The message of a stored document that fails :attr:`verify` or its
            revision column (``{key}``: its id).
        invalid: The code of such a document.
        receipt: The receipt's type.
        receipts: The store's table of the receipts.
        receipt_columns: A receipt row's columns besides the id, the sequence and the JSON.
        key_column: The id's name, in the documents, the receipts and the receipts' table.
        noun: What the messages call a document (``"Run"``, ``"Stream"``).
        stale: The code of a compare-and-swap that finds another revision stored.
    """

    document: type[D]
    documents: Callable[[LedgerStore], Documents]
    columns: Callable[[D], Mapping[str, object]]
    verify: Callable[[D], bool] | None = None
    unreadable: str | None = None
    unverified: str
    invalid: str
    receipt: type[R]
    receipts: Callable[[LedgerTables], sql.Identifier]
    receipt_columns: Callable[[R], Mapping[str, object]]
    key_column: str
    noun: str
    stale: str

    def key(self, record: D | R) -> str:
        """The id of a document or receipt."""
        return str(getattr(record, self.key_column))


def _run_receipt_columns(receipt: BatchReceipt) -> Mapping[str, object]:
    seen = receipt.observation
    return {
        "batch_id": receipt.batch_id,
        "batch_digest": receipt.batch_digest,
        "previous_checkpoint": receipt.previous_checkpoint,
        "checkpoint": receipt.checkpoint,
        "last_cursor": seen.last_cursor,
        "copied_count": seen.copied_count,
        "duplicate_count": seen.duplicate_count,
        "content_hash": seen.content_hash,
    }


FIXED_MARK_RECORDS: JobRecords[BackfillRun, BatchReceipt] = JobRecords(
    document=BackfillRun,
    documents=lambda store: store.runs,
    columns=lambda run: {"run_digest": run.run_digest, "status": run.status.value},
    verify=run_integrity_is_valid,
    unreadable="backfill_persistence_failed",
    unverified="Stored run {key} does not verify.",
    invalid="backfill_run_invalid",
    receipt=BatchReceipt,
    receipts=lambda tables: tables.batch_receipts,
    receipt_columns=_run_receipt_columns,
    key_column="run_id",
    noun="Run",
    stale="backfill_checkpoint_stale",
)
"""The fixed mark's records: a run per scope, with its digest and status columns, verified by
the integrity rule."""

MOVING_MARK_RECORDS: JobRecords[StreamState, StreamReceipt] = JobRecords(
    document=StreamState,
    documents=lambda store: store.streams,
    columns=lambda state: {"target_rows": state.target_rows},
    unverified="The stored state of {key} does not match its revision column.",
    invalid="incremental_stream_stale",
    receipt=StreamReceipt,
    receipts=lambda tables: tables.stream_receipts,
    receipt_columns=lambda receipt: {"run": receipt.run},
    key_column="stream_id",
    noun="Stream",
    stale="incremental_stream_stale",
)
"""The moving mark's records: a state per stream, with its ``target_rows`` column."""


class CursorLedger(Generic[D, R]):
    """Reads and writes one policy's documents and receipts on a given connection (the caller
    owns transactions).

    Args:
        schema: The ledger schema's exact name.
        records: The policy's records.
    """

    def __init__(self, schema: str, records: JobRecords[D, R]) -> None:
        self.store = LedgerStore(schema)
        self.schema = schema
        self.records: JobRecords[D, R] = records
        self._documents = records.documents(self.store)
        self._receipts_table = records.receipts(self.store.tables)
        names = {"t": self._receipts_table, "k": sql.Identifier(records.key_column)}
        select = "SELECT receipt_json FROM {t} WHERE {k} = %s"
        self._receipts = sql.SQL(select + " ORDER BY sequence").format(**names)
        self._run_receipts = sql.SQL(select + " AND run = %s ORDER BY sequence").format(**names)
        self._receipt = sql.SQL(select + " AND batch_id = %s").format(**names)

    def ensure(self, conn: Connection) -> None:
        """Brings the ledger up to date (its schema and tables created if missing)."""
        self.store.ensure(conn)

    def exists(self, conn: Connection) -> bool:
        """Whether the ledger holds the policy's tables (read in ``conn``'s current
        transaction)."""
        found = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL",
            (self._documents.table.as_string(conn), self._receipts_table.as_string(conn)),
        ).fetchone()
        return found is not None and bool(found[0])

    def lock(self, conn: Connection, key: str) -> None:
        """Takes the job's advisory lock until the current transaction ends (waits if held)."""
        self.store.lock(conn, key)

    def fetch(self, conn: Connection, key: str) -> D | None:
        """The stored document, verified, or ``None`` when the ledger has none.

        Raises:
            EngineError: the policy's unreadable code for a document that does not parse, its
                invalid code for one that fails the integrity rule or its revision column.
        """
        records = self.records
        stored = self._documents.fetch(conn, key)
        if stored is None:
            return None
        try:
            document: D = records.document.model_validate({**stored.document, **stored.later})
        except ValidationError as exc:
            if records.unreadable is None:
                raise
            raise engine_error(
                records.unreadable,
                f"Stored {records.noun.lower()} {key} is unreadable: "
                f"{exc.error_count()} validation errors.",
                ["Restore the ledger row from a backup of the last integrity-valid revision."],
            ) from None
        verified = records.verify is None or records.verify(document)
        if document.revision != stored.revision or not verified:
            raise engine_error(records.invalid, records.unverified.format(key=key))
        return document

    def insert(self, conn: Connection, document: D) -> D:
        """Stores a new document unless one with its id exists; returns the stored one."""
        key = self.records.key(document)
        self._documents.insert(
            conn, key, document.revision, as_json(document), **self.records.columns(document)
        )
        stored = self.fetch(conn, key)
        assert stored is not None
        return stored

    def swap(self, conn: Connection, before: D | None, after: D) -> None:
        """Stores ``after`` if the stored revision is still ``before``'s (``None``: if none is
        stored yet).

        Raises:
            EngineError: the policy's stale code when another revision was stored.
        """
        key, body, columns = self.records.key(after), as_json(after), self.records.columns(after)
        if before is None:
            saved = self._documents.insert(conn, key, after.revision, body, **columns)
        else:
            saved = self._documents.swap(
                conn, key, before.revision, after.revision, body, **columns
            )
        if not saved:
            raise engine_error(
                self.records.stale,
                f"{self.records.noun} {key} is no longer at revision "
                f"{None if before is None else before.revision}.",
            )

    def record(self, conn: Connection, before: D, after: D, receipt: R) -> None:
        """Inserts the batch's receipt and advances the document (compare-and-swap), in the
        open transaction."""
        records = self.records
        row = {
            records.key_column: records.key(receipt),
            "sequence": receipt.sequence,
            **records.receipt_columns(receipt),
            "receipt_json": as_json(receipt),
        }
        self.store.insert_row(conn, self._receipts_table, row)
        self.swap(conn, before, after)

    def receipts(self, conn: Connection, key: str, run: int | None = None) -> list[R]:
        """The job's receipts (of one run of a stream, when given), in sequence order."""
        if run is None:
            rows = conn.execute(self._receipts, (key,)).fetchall()
        else:
            rows = conn.execute(self._run_receipts, (key, run)).fetchall()
        return [self.records.receipt.model_validate(r[0]) for r in rows]

    def receipt(self, conn: Connection, key: str, batch_id: str) -> R | None:
        """The committed receipt of ``batch_id`` (a fixed mark's batch), if any."""
        row = conn.execute(self._receipt, (key, batch_id)).fetchone()
        return None if row is None else self.records.receipt.model_validate(row[0])


class RunLedger(CursorLedger[BackfillRun, BatchReceipt]):
    """The fixed mark's ledger (:data:`FIXED_MARK_RECORDS`): backfill runs, their receipts and
    their range checks.

    Args:
        schema: The ledger schema's exact name.
    """

    def __init__(self, schema: str = DEFAULT_LEDGER_SCHEMA) -> None:
        super().__init__(schema, FIXED_MARK_RECORDS)
        tables = self.store.tables
        self._check = tables.sql(
            "INSERT INTO {range_checks} (run_id, sequence, outcome, code, check_json)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (run_id, sequence) DO UPDATE"
            " SET outcome = excluded.outcome, code = excluded.code,"
            " check_json = excluded.check_json, checked_at = clock_timestamp()"
        )
        self._times = tables.sql(
            "SELECT (SELECT max(committed_at) FROM {batch_receipts} WHERE run_id = %s),"
            " (SELECT max(checked_at) FROM {range_checks} WHERE run_id = %s)"
        )

    def runs(self, conn: Connection, status: BackfillStatus | None = None) -> list[BackfillRun]:
        """The runs of the ledger (any scope): every one, parsed, or those in ``status``,
        verified."""
        if status is None:
            return [BackfillRun.model_validate(d) for d in self._documents.all(conn)]
        ids = self._documents.keys_where(conn, "status", status.value)
        return [run for run_id in ids if (run := self.fetch(conn, run_id))]

    def times(self, conn: Connection, run_id: str) -> tuple[datetime | None, datetime | None]:
        """When the run's newest batch committed and its newest range check was recorded."""
        row = conn.execute(self._times, (run_id, run_id)).fetchone()
        assert row is not None
        return row[0], row[1]

    def record_checks(self, conn: Connection, report: ReconciliationReport) -> None:
        """Stores each range check of ``report`` (the newest check of a range replaces older)."""
        rows = [
            (report.run_id, check.sequence, check.outcome.value, check.code, as_json(check))
            for check in report.ranges
        ]
        with conn.cursor() as cur:
            cur.executemany(self._check, rows)


class StreamLedger(CursorLedger[StreamState, StreamReceipt]):
    """The moving mark's ledger (:data:`MOVING_MARK_RECORDS`): stream states and receipts.

    Args:
        schema: The ledger schema's exact name.
    """

    def __init__(self, schema: str = DEFAULT_LEDGER_SCHEMA) -> None:
        super().__init__(schema, MOVING_MARK_RECORDS)
