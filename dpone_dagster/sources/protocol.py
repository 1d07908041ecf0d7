"""The adapter protocol every generic source implements, and its row-stream artifact.

A generic source (MySQL/MariaDB, REST, later MSSQL or Kafka) has no snapshot that PostgreSQL's
rules could prove, so its receipt says only what the orchestrator saw. The seven points of the
connector checklist are kept here once, for every adapter:

1. the read window opens (``acquire()``) when the first row is asked for, right before the
   adapter sends its first query or request: the truthful source-read boundary;
2. one lifecycle authority is bound to the artifact and to its :class:`ExtractResult`;
3. ``complete()`` is called only after the source said it has no more rows, with the rows
   counted on the way and the bytes the adapter could measure;
4. and 5. the adapter attaches its live resource (a session, an HTTP client) to the artifact, so
   ``success`` commits and closes it while ``abort`` and ``retain_commit_unknown`` roll back and
   close it;
6. and 7. no snapshot claim: the receipt's clock is ``dpone.orchestrator.utc`` and
   ``snapshot_authority`` / ``source_token`` stay empty (there is no snapshot token to compose).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from psycopg import sql

from dpone_dagster.lifecycle import (
    ORCHESTRATOR_UTC,
    DponeError,
    ExtractionArtifact,
    ExtractResult,
    LifecycleError,
)
from dpone_dagster.postgres import TableName, check_identifier
from dpone_dagster.postgres.connection import Connection

Row = tuple[object, ...]
"""One row as the adapter hands it to COPY: values in column order, ``None`` for NULL."""

# The PostgreSQL types an adapter may declare: a closed grammar of built-in type names with an
# optional numeric modifier, so a type string can be composed into SQL text safely.
_PG_TYPE = re.compile(r"^[a-z][a-z ]*[a-z](\(\d+(,\d+)?\))?$")


class SourceError(DponeError):
    """A generic source failed: a type it cannot map, a request or a record it cannot read."""


@dataclass(frozen=True)
class SourceColumn:
    """One column of a generic source, with the PostgreSQL type its values are staged as.

    Attributes:
        name: The column name, used as-is in the staging and target tables.
        pg_type: The PostgreSQL type (``bigint``, ``numeric(20,0)``, ``jsonb``...), from the
            adapter's own mapping table: never user text.
        source_type: The type as the source spells it (``bigint(20) unsigned``), for messages.
        nullable: The source may send NULL.
    """

    name: str
    pg_type: str
    source_type: str
    nullable: bool = True

    def __post_init__(self) -> None:
        check_identifier(self.name, what="column")
        if not _PG_TYPE.match(self.pg_type):
            raise ValueError(f"{self.pg_type!r} is not a built-in PostgreSQL type name")

    @property
    def definition(self) -> sql.Composed:
        """``"name" type`` for a CREATE TABLE column list."""
        return sql.SQL("{} {}").format(sql.Identifier(self.name), sql.SQL(self.pg_type))


class ByteMeter:
    """Counts the bytes an adapter received from its source (its byte evidence)."""

    def __init__(self) -> None:
        self.bytes: int | None = None

    def add(self, count: int) -> None:
        """Adds ``count`` received bytes."""
        self.bytes = (self.bytes or 0) + count


RowOpener = Callable[["RowStreamArtifact", ByteMeter], Iterator[Row]]
"""Sends the source read and yields its rows. It attaches its live resource to the artifact."""

ProgressHook = Callable[[int], None]
"""Called with the rows written so far, every ``PROGRESS_EVERY`` rows (progress, fault tests)."""

PROGRESS_EVERY = 10_000


class RowStreamArtifact(ExtractionArtifact):
    """A lazy stream of rows from a generic source, read once.

    Nothing is read until :meth:`rows` is consumed: the window opens on the first row asked for
    and completes only when the source reports that no row is left. A consumer that stops early,
    or a source that fails mid-stream, leaves the receipt acquired but not completed.

    Args:
        columns: The stream's columns (known before any row moves).
        opener: Sends the read and yields converted rows; see :data:`RowOpener`.
        source_label: What is read (``mysql://host:3306/db.table``), for messages; no secrets.
    """

    def __init__(
        self, columns: Sequence[SourceColumn], opener: RowOpener, *, source_label: str
    ) -> None:
        super().__init__()
        self.columns: tuple[SourceColumn, ...] = tuple(columns)
        self.source_label = source_label
        self.on_progress: ProgressHook | None = None
        self._opener = opener
        self._claim = threading.Lock()
        self._claimed = False

    def rows(self) -> Iterator[Row]:
        """Reads the source once, yielding rows in column order.

        Raises:
            LifecycleError: ``stream_already_consumed`` on a second read, and
                ``artifact_already_settled`` when the artifact already has a terminal outcome.
        """
        with self._claim:
            if self._claimed:
                raise LifecycleError(
                    "stream_already_consumed",
                    f"The rows of {self.source_label} were already read; a stream is read once.",
                    ["Extract again for a new read."],
                )
            self._claimed = True
        if self.terminal.decided:
            raise LifecycleError(
                "artifact_already_settled",
                f"The extraction of {self.source_label} already has a terminal outcome.",
                ["Extract again for a new read."],
            )
        return self._read()

    @property
    def exact_rows(self) -> bool:
        """False: the rows are converted on their way (row versions can never prove them)."""
        return False

    @property
    def writers(self) -> tuple[int, ...]:
        """None: the load's own transaction writes the rows."""
        return ()

    def load_into(self, conn: Connection, staging: TableName) -> int:
        """Streams every row into ``staging`` with one text ``COPY ... FROM STDIN``.

        Text format because the adapters hand over values PostgreSQL parses exactly in text
        (JSON text, bit strings, aware datetimes); psycopg escapes each value for COPY. Calls
        :attr:`on_progress` with the rows written so far every ``PROGRESS_EVERY`` rows.

        Returns:
            The rows the target's COPY command tag reported.
        """
        statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
            staging.ident, sql.SQL(", ").join(sql.Identifier(c.name) for c in self.columns)
        )
        with conn.cursor() as cursor:
            with cursor.copy(statement) as copy:
                for written, row in enumerate(self.rows(), 1):
                    copy.write_row(row)
                    if self.on_progress is not None and written % PROGRESS_EVERY == 0:
                        self.on_progress(written)
            return cursor.rowcount

    def _read(self) -> Iterator[Row]:
        meter = ByteMeter()
        self.lifecycle.acquire(clock_authority=ORCHESTRATOR_UTC)
        count = 0
        for row in self._opener(self, meter):
            count += 1
            yield row
        # Reached only when the source itself said "no more rows".
        self.lifecycle.complete(row_count=count, byte_count=meter.bytes)


class SourceAdapter(Protocol):
    """What every generic source implements.

    ``describe()`` maps the source's types before any row moves (a type it cannot map raises
    :class:`SourceError`); ``extract()`` returns a pending :class:`RowStreamArtifact` in a
    result bound to the same authority.
    """

    @property
    def label(self) -> str:
        """What is read, for messages and metadata (never a secret)."""

    def describe(self) -> list[SourceColumn]:
        """The source's columns with their PostgreSQL types."""

    def extract(self) -> ExtractResult[RowStreamArtifact]:
        """A lazy extraction: nothing is read until its rows are consumed."""


def extract_stream(
    columns: Sequence[SourceColumn], opener: RowOpener, *, source_label: str
) -> ExtractResult[RowStreamArtifact]:
    """Builds a pending row-stream artifact and the result bound to its authority."""
    return ExtractResult(RowStreamArtifact(columns, opener, source_label=source_label))
