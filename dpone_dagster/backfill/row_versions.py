"""Row-version proofs: a batch range that nobody touched since its copy is proven equal without
hashing it.

Hashing every row of both sides is the exact test, and it costs about as much CPU as the copy.
PostgreSQL already records who wrote every row version (``xmin``), so most ranges can be proven
equal far more cheaply (a count and one comparison per row: about a fifth of the hash's time
in ``bench/backfill.py``). Each batch copied by binary COPY straight into the target records,
in its receipt (and so in the checkpoint chain), a :class:`~.protocol.RowVersionEvidence`:

* the source snapshot's ``xmin``: every transaction with a smaller id had ended when the batch
  was read;
* the 32-bit id of the target (sub)transaction whose COPY inserted the batch's rows, and the
  64-bit id of its top-level transaction;
* a key of each table's identity (its OID) and of the copied columns (name, number, type,
  modifier), taken when the shape was resolved.

At the reconciliation, inside its two snapshots, a range is **proven** when all of this holds:

* **source**: the range holds as many rows as the batch snapshot counted, and every one of them
  was written by a transaction older than that snapshot's ``xmin``. A row version is immutable;
  one that is visible now and was written before the batch snapshot was visible to it too (its
  deleter, if any, has not committed even now). So the rows now are a subset of the rows the batch
  copied, of the same size: the same rows. An update, a delete plus an insert, a subtransaction
  of a writer that was in flight at the batch (its ids are not below ``xmin``), a ``TRUNCATE`` and
  reload, a table rewrite: each leaves a newer ``xmin`` or another count, and the range is hashed.
* **target**: the range holds as many rows as the batch inserted, and every one of them carries
  the batch's own transaction id. Only that COPY wrote rows with that id, and they are the
  source's rows byte for byte (binary COPY between identical column types); a target row that
  was changed, deleted and re-inserted, or added since, has another ``xmin`` or another count.
* **both tables** are still the same plain tables with the same copied columns (their keys are
  equal), with no row-level security and no inheritance children, so no other rows can come into
  view without a new ``xmin`` (a table swapped in by ``RENAME``, a column dropped and re-added with
  a default, a child attached); no copied column has a user-defined type (renaming an enum label
  changes what a stored value means without writing a row).
* **no wraparound**: fewer than 2^30 transactions have passed on either server since the batch,
  so 32-bit ids compare exactly (``age`` is exact within 2^31).

**All ranges at once.** When every range of the run has evidence, one query per side covers
the whole run first (a sequential scan where the run is most of the table): the source rows all
older than the oldest batch snapshot's ``xmin``, the target rows all written by one of the
batches' COPYs, and the totals equal to the sums of the batch counts. That proves every range:
each range's rows now are a subset of what its batch copied (as above), so no range holds more
than its batch count, and the totals leave no room for any range to hold fewer. When the
whole-run query fails (somebody wrote somewhere), each range is tested on its own.

Anything else (a staged batch, a target with triggers at copy time, a missing or stale key, a
range where either test fails) is hashed exactly as before (:mod:`.digest`). The proof trusts
PostgreSQL's own MVCC bookkeeping; tools that rewrite it by hand (``pg_resetwal``,
``pg_surgery``'s forced freeze) void it, as they void every snapshot's guarantees.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import sha256

import psycopg
from psycopg import sql

from dpone_dagster.postgres.catalog import Column, relation_oid
from dpone_dagster.postgres.identifiers import TableName

from .protocol import RowVersionEvidence

Conn = psycopg.Connection[tuple[object, ...]]

MAX_DISTANCE = 2**30
"""Transactions allowed between a batch and its proof: well inside the 2^31 ``age`` is exact for."""

_TABLE = """
SELECT c.relkind::text, c.relrowsecurity,
       EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhparent = c.oid),
       array_agg(json_build_array(a.attname, a.attnum, a.atttypid::int, a.atttypmod)::text
                 ORDER BY a.attnum)
FROM pg_class c
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE c.oid = %s AND a.attname = ANY(%s)
GROUP BY c.oid
"""


@dataclass(frozen=True)
class TableKeys:
    """The row-version keys of the source and target tables (see :func:`table_key`)."""

    source: str
    target: str
    target_oid: int


def table_key(conn: Conn, table: TableName, columns: Sequence[Column]) -> tuple[int, str] | None:
    """The table's OID and a key of its identity and copied columns, read in ``conn``'s snapshot.

    ``None`` when row versions cannot prove the table's content: not a plain table, row-level
    security, inheritance children, or a copied column of a user-defined type.
    """
    if any(c.user_type for c in columns):
        return None
    oid = relation_oid(conn, table)
    if oid is None:
        return None
    row = conn.execute(_TABLE, (oid, [c.name for c in columns])).fetchone()
    if row is None or row[0] != "r" or row[1] or row[2]:
        return None
    attrs = list(row[3])  # type: ignore[call-overload]
    if len(attrs) != len(columns):
        return None
    return oid, sha256(json.dumps([oid, attrs]).encode()).hexdigest()


def keys_for(
    src: Conn, tgt: Conn, source: TableName, target: TableName, columns: Sequence[Column]
) -> TableKeys | None:
    """Both tables' keys, or ``None`` when either cannot be proven by row versions."""
    s = table_key(src, source, columns)
    t = table_key(tgt, target, columns)
    if s is None or t is None:
        return None
    return TableKeys(s[1], t[1], t[0])


_AFTER_COPY = """SELECT count(*),
    (SELECT xmin::text FROM {t} WHERE {c} = {v} LIMIT 1),
    pg_current_xact_id()::text,
    EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = %s AND NOT tgisinternal)
FROM {t} WHERE {w}"""


def count_after_copy(
    tgt: Conn,
    target: TableName,
    cursor: Column,
    value: sql.Composable,
    where: tuple[sql.Composable, list[str]],
    first: str,
    keys: TableKeys,
    source_snapshot: str,
) -> tuple[int, RowVersionEvidence | None]:
    """Counts the batch range in the target right after its COPY, and takes the evidence.

    Runs in the batch's own target transaction, after the COPY (whose lock keeps triggers from
    being created or dropped meanwhile). When the count equals the rows copied, the range holds
    only the batch's rows, so the row at the first cursor value is one of them and its ``xmin``
    is the COPY's transaction id. A target with user triggers gives no evidence (a trigger may
    have changed the rows on their way in).
    """
    row = tgt.execute(
        sql.SQL(_AFTER_COPY).format(t=target.ident, c=cursor.ident, v=value, w=where[0]),
        [first, keys.target_oid, *where[1]],
    ).fetchone()
    assert row is not None
    count = int(row[0])  # type: ignore[call-overload]
    if row[1] is None or row[3]:
        return count, None
    evidence = RowVersionEvidence(
        source_xmin=int(source_snapshot.split(":", 1)[0]),
        source_table=keys.source,
        target_xid=int(str(row[1])),
        target_top_xid=int(str(row[2])),
        target_table=keys.target,
    )
    return count, evidence


@dataclass(frozen=True)
class Horizon:
    """One reconciliation side's newest transaction id (64-bit, its snapshot's ``xmax``) and key."""

    xmax: int
    key: str | None


def horizon(conn: Conn, table: TableName, columns: Sequence[Column]) -> Horizon:
    """Reads the side's horizon and table key inside its open reconciliation snapshot."""
    row = conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()
    assert row is not None
    found = table_key(conn, table, columns)
    return Horizon(int(str(row[0])), None if found is None else found[1])


def source_proof(
    table: TableName,
    where: tuple[sql.Composable, list[str]],
    evidence: Sequence[RowVersionEvidence],
) -> tuple[sql.Composed, list[object]]:
    """``count(*)`` and "every row is older than the oldest batch snapshot's xmin" over a range.

    ``age`` is measured from one transaction id per transaction, and PostgreSQL keeps it in the
    leader (it is parallel restricted), so both sides of the comparison use the same origin.
    """
    oldest = min(e.source_xmin for e in evidence)
    query = sql.SQL("SELECT count(*), min(age(xmin)) > age(%s::text::xid) FROM {} WHERE {}").format(
        table.ident, where[0]
    )
    return query, [str(oldest % 2**32), *where[1]]


def target_proof(
    table: TableName,
    where: tuple[sql.Composable, list[str]],
    evidence: Sequence[RowVersionEvidence],
) -> tuple[sql.Composed, list[object]]:
    """``count(*)`` and "every row was written by one of the batches' COPYs" over a range."""
    query = sql.SQL(
        "SELECT count(*), bool_and(xmin = ANY(%s::text[]::xid[])) FROM {} WHERE {}"
    ).format(table.ident, where[0])
    return query, [[str(e.target_xid) for e in evidence], *where[1]]


def usable(evidence: RowVersionEvidence, source: Horizon, target: Horizon) -> bool:
    """The evidence's keys match both tables now, and no wraparound can blur its ids."""
    return (
        source.key == evidence.source_table
        and target.key == evidence.target_table
        and 0 <= source.xmax - evidence.source_xmin < MAX_DISTANCE
        and 0 <= target.xmax - evidence.target_top_xid < MAX_DISTANCE
    )


def proven(found: tuple[object, ...], expected: int) -> bool:
    """A proof query's row says the range holds ``expected`` rows, all of the right versions."""
    count, ok = found
    return count == expected and (expected == 0 or ok is True)
