"""The one durable ledger store: revisioned documents, receipt rows and advisory locks.

Every engine keeps its durable state in the ledger (:mod:`.ledger_schema` has its tables): a
constant-size document per run or stream that moves by compare-and-swap on its revision, and one
receipt row per committed batch. Everything here runs on the caller's connection inside the
caller's transaction, so an engine writes a batch's rows, its receipt and its advanced state in
ONE target transaction when the ledger lives in the target (the default): a crash leaves all of
them or none.

Concurrency: :meth:`LedgerStore.lock` takes a transaction-scoped advisory lock per run or stream,
so two orchestrators of one run serialize batch by batch; the revision compare-and-swap of
:meth:`Documents.swap` is the second wall: progress is never overwritten by an older state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb
from pydantic import BaseModel

from dpone_dagster.postgres import check_dsn
from dpone_dagster.postgres.connection import Connection

from .ledger_schema import (
    DEFAULT_LEDGER_SCHEMA,
    LEDGER_VERSION,
    LedgerTables,
    ensure_ledger,
    ledger_version,
)
from .sessions import advisory_xact_lock


@dataclass(frozen=True)
class LedgerConfig:
    """Where the ledger lives.

    Attributes:
        dsn: ``None`` (the default) puts the ledger in the target database, where a batch's rows
            and its receipt commit in one transaction. A DSN puts it elsewhere (explicitly
            chosen): the batch then commits on the target first and its receipt second, and a
            crash between the two is repaired by replay (the rows are found present and equal
            and counted as duplicates; see docs/backfill.md).
        schema: The ledger's schema (any legal identifier).
    """

    dsn: str | None = field(default=None, repr=False)  # may hold a password
    schema: str = DEFAULT_LEDGER_SCHEMA

    def __post_init__(self) -> None:
        LedgerTables(self.schema)  # checks the identifier
        if self.dsn is not None:
            check_dsn(self.dsn)

    @property
    def in_target(self) -> bool:
        """True when the ledger shares the target's transactions."""
        return self.dsn is None


def as_json(document: BaseModel) -> Jsonb:
    """A model as the ``jsonb`` a ledger column stores."""
    return Jsonb(document.model_dump(mode="json"))


@dataclass(frozen=True)
class Stored:
    """A document as the ledger holds it: its revision column, its JSON and the values of the
    table's :attr:`Documents.later` columns (``None`` where the ledger has no such column yet)."""

    revision: int
    document: Any
    later: Mapping[str, Any] = field(default_factory=dict)


class Documents:
    """A ledger table of revisioned documents, one row per id (runs, streams).

    Args:
        table: The table.
        key: Its id column.
        body: Its ``jsonb`` document column.
        later: Columns a later migration added beside the document, read with it: a ledger
            not brought up to date yet (a read-only check before the first run of a new
            release) reads them as ``None`` instead of failing.
    """

    def __init__(
        self, table: sql.Identifier, key: str, body: str, later: tuple[str, ...] = ()
    ) -> None:
        self.table = table
        self.later = later
        names = {"t": table, "k": sql.Identifier(key), "b": sql.Identifier(body)}
        # Through the row's JSON, a missing column is NULL (a plain name would fail).
        extra = [sql.SQL(", to_jsonb(d) -> {}").format(sql.Literal(c)) for c in later]
        self._fetch = sql.SQL("SELECT revision, {b}{e} FROM {t} AS d WHERE {k} = %s").format(
            e=sql.Composed(extra), **names
        )
        self._all = sql.SQL("SELECT {b} FROM {t} ORDER BY {k}").format(**names)
        self._names = names

    def fetch(self, conn: Connection, key: str) -> Stored | None:
        """The stored document of ``key``, or ``None``."""
        row = conn.execute(self._fetch, (key,)).fetchone()
        if row is None:
            return None
        return Stored(int(str(row[0])), row[1], dict(zip(self.later, row[2:], strict=True)))

    def all(self, conn: Connection) -> list[Any]:
        """Every stored document, in id order."""
        return [r[0] for r in conn.execute(self._all).fetchall()]

    def keys_where(self, conn: Connection, column: str, value: str) -> list[str]:
        """The ids of the documents whose ``column`` equals ``value``, in id order."""
        query = sql.SQL("SELECT {k} FROM {t} WHERE {c} = %s ORDER BY {k}").format(
            c=sql.Identifier(column), **self._names
        )
        return [str(r[0]) for r in conn.execute(query, (value,)).fetchall()]

    def insert(
        self, conn: Connection, key: str, revision: int, document: Jsonb, **columns: object
    ) -> bool:
        """Stores a new document unless one with its id exists; ``True`` when it was stored.

        Args:
            conn: A session in the caller's transaction.
            key: The document's id.
            revision: Its revision.
            document: Its JSON.
            **columns: Other columns of the row (a run's digest and status).
        """
        names = [self._names["k"], sql.Identifier("revision"), self._names["b"]]
        names += [sql.Identifier(c) for c in columns]
        query = sql.SQL("INSERT INTO {t} ({names}) VALUES ({values}) ON CONFLICT ({k}) DO NOTHING")
        cur = conn.execute(
            query.format(
                names=sql.SQL(", ").join(names),
                values=sql.SQL(", ").join(sql.Placeholder() * len(names)),
                **self._names,
            ),
            [key, revision, document, *columns.values()],
        )
        return cur.rowcount == 1

    def swap(
        self,
        conn: Connection,
        key: str,
        before: int,
        after: int,
        document: Jsonb,
        **columns: object,
    ) -> bool:
        """Replaces the document of ``key`` if its stored revision is still ``before``.

        Returns:
            ``True`` when it was replaced; ``False`` when another revision is stored (the
            caller raises its engine's stale code).
        """
        sets = [sql.SQL("revision = %s"), sql.SQL("{} = %s").format(self._names["b"])]
        sets += [sql.SQL("{} = %s").format(sql.Identifier(c)) for c in columns]
        query = sql.SQL(
            "UPDATE {t} SET {sets}, updated_at = clock_timestamp() WHERE {k} = %s AND revision = %s"
        ).format(sets=sql.SQL(", ").join(sets), **self._names)
        cur = conn.execute(query, [after, document, *columns.values(), key, before])
        return cur.rowcount == 1


class LedgerStore:
    """The ledger's tables in one schema, on whatever connection the caller passes.

    Args:
        schema: The ledger schema's exact name.
    """

    def __init__(self, schema: str = DEFAULT_LEDGER_SCHEMA) -> None:
        self.tables = LedgerTables(schema)
        self.schema = schema
        self.runs = Documents(self.tables.runs, "run_id", "run_json")
        self.streams = Documents(
            self.tables.streams, "stream_id", "state_json", later=("target_rows",)
        )

    def ensure(self, conn: Connection) -> None:
        """Brings the ledger up to date (see :func:`.ledger_schema.ensure_ledger`)."""
        ensure_ledger(conn, self.tables)

    def current(self, conn: Connection) -> bool:
        """The ledger exists with every migration applied (one read)."""
        return ledger_version(conn, self.tables) >= LEDGER_VERSION

    @staticmethod
    def lock(conn: Connection, key: str) -> None:
        """Takes the advisory lock of a run or stream until the current transaction ends (waits
        while another transaction holds it)."""
        advisory_xact_lock(conn, key)

    def insert_row(
        self, conn: Connection, table: sql.Identifier, row: Mapping[str, object]
    ) -> None:
        """Inserts one receipt row into ``table`` (a column per key of ``row``)."""
        query = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            table,
            sql.SQL(", ").join(sql.Identifier(c) for c in row),
            sql.SQL(", ").join(sql.Placeholder() * len(row)),
        )
        conn.execute(query, list(row.values()))
