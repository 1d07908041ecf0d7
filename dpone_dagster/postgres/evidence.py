"""Row-version evidence: who wrote the rows a load put in the target, taken right after the write.

PostgreSQL records the transaction that wrote every row version (``xmin``). A load that writes a
table's rows with one binary COPY (or one ``INSERT ... SELECT`` in the same database) can note,
inside its own transaction, the id of that writer and a key of both tables' identity; later, the
reconciliation's row-version prover (:mod:`dpone_dagster.reconcile.row_versions`) proves the
target unchanged since the load by counting rows that still carry that id, without reading a
value. This module takes the evidence; the reconciliation judges it.

A table's key is its OID plus the name, number, type and modifier of each copied column: a table
swapped in by ``RENAME``, or a column dropped and re-added with a default, changes it. Tables the
proof cannot cover give no key: not a plain table, row-level security, inheritance children, or a
copied column of a user-defined type (renaming an enum label changes what a stored value means
without writing a row). A target with user triggers gives no evidence (a trigger may have changed
the rows on their way in).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import sha256
from typing import Annotated

from psycopg import sql
from pydantic import BaseModel, ConfigDict, Field

from .catalog import Column, relation_oid
from .connection import Connection
from .identifiers import TableName

_TABLE = """
SELECT c.relkind::text, c.relrowsecurity,
       EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhparent = c.oid),
       array_agg(json_build_array(a.attname, a.attnum, a.atttypid::bigint, a.atttypmod)::text
                 ORDER BY a.attnum)
FROM pg_class c
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE c.oid = %s::bigint::oid AND a.attname = ANY(%s)
GROUP BY c.oid
"""

_WRITER = """SELECT {count},
    (SELECT xmin::text FROM {t} {w} LIMIT 1),
    pg_current_xact_id()::text,
    EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = %s::bigint::oid AND NOT tgisinternal)"""


class RowVersionEvidence(BaseModel):
    """What lets the reconciliation prove rows unchanged since a load without hashing them.

    Attributes:
        source_xmin: The oldest transaction of the source database the reading snapshot may have
            seen in flight (64-bit; at most its ``xmax``, at least its ``xmin``): every older
            writer of the database's tables had ended when the rows were read. None when the
            reconciliation reads the source in that very snapshot (a snapshot copy's check),
            where the source needs no proof.
        source_table: Key of the source table's identity and copied columns; None, like
            ``source_xmin``, when the reconciliation reads the load's own snapshot.
        target_xids: The 32-bit ids of the (sub)transactions that wrote the rows.
        target_top_xid: The 64-bit id of the oldest writing top-level transaction.
        target_table: Key of the target table's identity and copied columns.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    source_xmin: int | None = Field(default=None, ge=3)
    source_table: str | None = Field(default=None, min_length=1)
    target_xids: tuple[Annotated[int, Field(ge=3, lt=2**32)], ...] = Field(min_length=1)
    target_top_xid: int = Field(ge=3)
    target_table: str = Field(min_length=1)


@dataclass(frozen=True)
class TableKeys:
    """The row-version keys of a source and a target table (see :func:`table_key`); no source
    key when the reconciliation will read the load's own snapshot."""

    source: str | None
    target: str
    target_oid: int


def table_key(
    conn: Connection, table: TableName, columns: Sequence[Column]
) -> tuple[int, str] | None:
    """The table's OID and a key of its identity and copied columns, read in ``conn``'s snapshot.

    ``None`` when row versions cannot prove the table's content (see the module's docstring).
    """
    if any(c.user_type for c in columns):
        return None
    oid = relation_oid(conn, table)
    if oid is None:
        return None
    row = conn.execute(_TABLE, (oid, [c.name for c in columns])).fetchone()
    if row is None or row[0] != "r" or row[1] or row[2]:
        return None
    attrs = list(row[3])
    if len(attrs) != len(columns):
        return None
    return oid, sha256(json.dumps([oid, attrs]).encode()).hexdigest()


def keys_for(
    src: Connection,
    tgt: Connection,
    source: TableName,
    target: TableName,
    columns: Sequence[Column],
) -> TableKeys | None:
    """Both tables' keys, or ``None`` when either cannot be proven by row versions."""
    s = table_key(src, source, columns)
    t = table_key(tgt, target, columns)
    if s is None or t is None:
        return None
    return TableKeys(s[1], t[1], t[0])


def written_rows(
    tgt: Connection,
    target: TableName,
    keys: TableKeys,
    *,
    where: tuple[sql.Composable, Sequence[object]] | None = None,
    first: tuple[sql.Composable, Sequence[object]] | None = None,
    source_xmin: int | None = None,
    count: bool = True,
) -> tuple[int | None, RowVersionEvidence | None]:
    """Counts the rows a load just wrote, and takes the evidence of who wrote them.

    Runs in the load's own target transaction, right after the write (whose lock keeps
    triggers from being created or dropped meanwhile). When the count equals the rows written,
    the counted rows are only the load's, so any one of them carries the writer's id.

    Args:
        tgt: The target session, inside the writing transaction.
        target: The target table.
        keys: Both tables' keys (:func:`keys_for`).
        where: The written range (a filter and its parameters); the whole table when None.
        first: A filter picking rows of the write cheaply (an index probe); ``where`` when None.
        source_xmin: The reading snapshot's ``xmin``, when the source will need a proof.
        count: Count the rows (None is returned in its place otherwise).

    Returns:
        The count and the evidence (None when a user trigger exists or no row was written).
    """
    filtered, params = where if where is not None else (sql.SQL("true"), ())
    probe, probe_params = first if first is not None else (filtered, params)
    counted = sql.SQL("(SELECT count(*) FROM {} WHERE {})").format(target.ident, filtered)
    query = sql.SQL(_WRITER).format(
        count=counted if count else sql.SQL("NULL::bigint"),
        t=target.ident,
        w=sql.SQL("WHERE {}").format(probe),
    )
    row = tgt.execute(query, [*(params if count else ()), *probe_params, keys.target_oid])
    found = row.fetchone()
    assert found is not None
    rows = None if found[0] is None else int(found[0])
    if found[1] is None or found[3]:
        return rows, None
    return rows, RowVersionEvidence(
        source_xmin=source_xmin,
        source_table=keys.source,
        target_xids=(int(str(found[1])),),
        target_top_xid=int(str(found[2])),
        target_table=keys.target,
    )


_LOAD = """SELECT pg_current_xact_id()::text,
    EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = %s::bigint::oid AND NOT tgisinternal)"""


def own_writes(
    tgt: Connection, keys: TableKeys, *, source_xmin: int | None = None
) -> RowVersionEvidence | None:
    """The evidence of rows the open target transaction wrote itself, no savepoint open (a
    ``COPY`` into a table nobody else writes): its own id, without reading a row back.

    Args:
        tgt: The target session, inside the writing transaction, after the write.
        keys: Both tables' keys (:func:`keys_for`).
        source_xmin: The reading snapshot's ``xmin``, when the source will need a proof.

    Returns:
        The evidence, or None when the target has user triggers.
    """
    row = tgt.execute(_LOAD, (keys.target_oid,)).fetchone()
    assert row is not None
    if row[1]:
        return None
    top = int(str(row[0]))
    return RowVersionEvidence(
        source_xmin=source_xmin,
        source_table=keys.source,
        target_xids=(top % 2**32,),
        target_top_xid=top,
        target_table=keys.target,
    )


def load_writers(
    tgt: Connection, target: TableName, columns: Sequence[Column], *, others: Sequence[int] = ()
) -> RowVersionEvidence | None:
    """The evidence of a load that just replaced ``target``'s rows in its own transaction.

    Every row the target now holds was written by this transaction (a COPY into the staging
    table swapped in, or an ``INSERT ... SELECT`` from it) or by ``others``: the worker
    transactions that filled a committed staging table. The reconciliation reads the source in
    the load's own snapshot, so no source key or ``xmin`` is taken.

    Args:
        tgt: The target session, inside the load's transaction, no savepoint open.
        target: The target table.
        columns: The copied columns.
        others: 64-bit ids of other transactions that wrote the rows (partitioned workers).

    Returns:
        The evidence, or None when the table cannot be proven or has user triggers.
    """
    found = table_key(tgt, target, columns)
    if found is None:
        return None
    row = tgt.execute(_LOAD, (found[0],)).fetchone()
    assert row is not None
    if row[1]:
        return None
    writers = [int(str(row[0])), *others]
    return RowVersionEvidence(
        target_xids=tuple(sorted({w % 2**32 for w in writers})),
        target_top_xid=min(writers),
        target_table=found[1],
    )
