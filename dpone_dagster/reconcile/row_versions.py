"""The row-version prover: rows nobody touched since they were copied are proven equal without
being hashed.

Hashing every row of both sides is the exact test, and it costs about as much CPU as the copy.
PostgreSQL already records who wrote every row version (``xmin``), so most copied rows can be
proven equal far more cheaply (a count and one comparison per row). A load that wrote rows with
one binary COPY (or one ``INSERT ... SELECT`` in the same database) takes, in its own transaction,
the :class:`~dpone_dagster.postgres.evidence.RowVersionEvidence` of that write: the writer's
transaction id and a key of both tables. At the reconciliation, inside its snapshots, a set of
rows (a backfill's batch range, a snapshot copy's whole table) is **proven** when all of this
holds:

* **target**: the rows number as many as the load wrote, and every one of them carries the
  load's own transaction id. Only that write produced rows with that id, and they are the
  source's rows byte for byte (binary COPY between identical column types); a target row that
  was changed, deleted and re-inserted, or added since, has another ``xmin`` or another count.
* **source**: either the reconciliation reads the very snapshot the load read (a snapshot copy's
  check: the rows are the same by definition, and their count must equal the rows copied), or
  the rows number as many as the batch snapshot counted and every one was written by a
  transaction older than that snapshot's ``xmin`` (a backfill). A row version is immutable; one
  that is visible now and was written before the batch snapshot was visible to it too, so the
  rows now are a subset of the rows the batch copied, of the same size: the same rows. An update,
  a delete plus an insert, a subtransaction of a writer in flight at the batch, a ``TRUNCATE``
  and reload, a table rewrite: each leaves a newer ``xmin`` or another count.
* **both tables** are still the same plain tables with the same copied columns (their keys are
  equal; see :mod:`dpone_dagster.postgres.evidence`);
* **no wraparound**: fewer than 2^30 transactions have passed on either server since the write,
  so 32-bit ids compare exactly (``age`` is exact within 2^31).

Whatever fails any test is hashed (:mod:`.digest`). The proof trusts PostgreSQL's own MVCC
bookkeeping; tools that rewrite it by hand (``pg_resetwal``, ``pg_surgery``'s forced freeze)
void it, as they void every snapshot's guarantees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import sql

from dpone_dagster.postgres import Column, TableName
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.evidence import RowVersionEvidence, table_key

Filter = tuple[sql.Composable, Sequence[object]]

MAX_DISTANCE = 2**30
"""Transactions allowed between a write and its proof: well inside the 2^31 ``age`` is exact for."""


@dataclass(frozen=True)
class Horizon:
    """One side's newest transaction id (64-bit, its snapshot's ``xmax``) and table key."""

    xmax: int
    key: str | None


def horizon(conn: Connection, table: TableName, columns: Sequence[Column]) -> Horizon:
    """Reads the side's horizon and table key inside its open reconciliation snapshot."""
    row = conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()
    assert row is not None
    found = table_key(conn, table, columns)
    return Horizon(int(str(row[0])), None if found is None else found[1])


def usable(evidence: RowVersionEvidence, source: Horizon, target: Horizon) -> bool:
    """The evidence's keys match both tables now, and no wraparound can blur its ids."""
    source_ok = evidence.source_xmin is None or (
        0 <= source.xmax - evidence.source_xmin < MAX_DISTANCE
    )
    return (
        (evidence.source_table is None or source.key == evidence.source_table)
        and target.key == evidence.target_table
        and source_ok
        and 0 <= target.xmax - evidence.target_top_xid < MAX_DISTANCE
    )


def source_proof(
    table: TableName, where: Filter, evidence: Sequence[RowVersionEvidence]
) -> tuple[sql.Composed, list[object]]:
    """``count(*)`` and "every row is older than the oldest reading snapshot's xmin".

    Evidence without a ``source_xmin`` (read in the reconciliation's own snapshot) needs the
    count alone. ``age`` is measured from one transaction id per transaction, and PostgreSQL
    keeps it in the leader (it is parallel restricted), so both sides of the comparison use the
    same origin.
    """
    marks = [e.source_xmin for e in evidence if e.source_xmin is not None]
    if not marks:
        query = sql.SQL("SELECT count(*), true FROM {} WHERE {}").format(table.ident, where[0])
        return query, list(where[1])
    query = sql.SQL("SELECT count(*), min(age(xmin)) > age(%s::text::xid) FROM {} WHERE {}").format(
        table.ident, where[0]
    )
    return query, [str(min(marks) % 2**32), *where[1]]


def target_proof(
    table: TableName, where: Filter, evidence: Sequence[RowVersionEvidence]
) -> tuple[sql.Composed, list[object]]:
    """``count(*)`` and "every row was written by one of the evidenced writes"."""
    query = sql.SQL(
        "SELECT count(*), bool_and(xmin = ANY(%s::text[]::xid[])) FROM {} WHERE {}"
    ).format(table.ident, where[0])
    return query, [[str(x) for e in evidence for x in e.target_xids], *where[1]]


def proven(found: tuple[object, ...], expected: int) -> bool:
    """A proof query's row says the rows number ``expected``, all of the right versions."""
    count, ok = found
    return count == expected and (expected == 0 or ok is True)
