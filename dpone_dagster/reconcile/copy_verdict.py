"""What a snapshot copy's reconciliation concludes for each table, from what it read.

:mod:`.copy_check` reads both sides (row versions, or both sides' count and digest); this module
names what each table's check guarantees (decided by the sink and the target's key) and judges
what was read against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from dpone_dagster.postgres import Column, Sink, TableName
from dpone_dagster.postgres.evidence import RowVersionEvidence

from .digest import Digest
from .proof import Proof


class Guarantee(StrEnum):
    """What a table's reconciliation checked (decided by the sink and the target's key)."""

    EQUAL = "equal"
    """The target holds exactly the snapshot's rows (``replace``)."""
    CONTAINS = "contains"
    """Every snapshot row is in the target, equal, by primary key (``merge``, keyed ``append``)."""
    COUNTS = "counts"
    """Row counts only (``append`` into a target without a primary key)."""


@dataclass(frozen=True)
class TableReconciliation:
    """One table's reconciliation.

    Attributes:
        source_table: The source table.
        target_table: The target table.
        sink: The copy's sink.
        guarantee: What was checked (see :class:`Guarantee`).
        proof: How it was established: row versions, or both sides' content hash.
        source: The source's digest inside the copy's snapshot (no hash under row versions).
        target: The target's digest: the whole table (``equal``, ``counts``) or its rows whose
            key is among the snapshot's (``contains``).
        passed: The guarantee holds.
        detail: One sentence on what was found.
        proved_at: The point in time the check proved its guarantee at: when the copy's snapshot
            was taken (the source server's clock), ``None`` when unknown.
    """

    source_table: TableName
    target_table: TableName
    sink: Sink
    guarantee: Guarantee
    proof: Proof
    source: Digest
    target: Digest
    passed: bool
    detail: str
    proved_at: datetime | None = None


@dataclass(frozen=True)
class CopiedTable:
    """A table to reconcile: what the report (if any) says about it, and what the catalogs add."""

    source: TableName
    target: TableName
    names: tuple[str, ...]
    rows_extracted: int | None = None
    rows_inserted: int | None = None
    rows_loaded: int | None = None
    evidence: RowVersionEvidence | None = None
    columns: tuple[Column, ...] = ()
    casts: tuple[tuple[str, str], ...] = ()
    key: tuple[str, ...] = ()
    guarantee: Guarantee = Guarantee.EQUAL
    target_exists: bool = True


def judge(
    table: CopiedTable, sink: Sink, source: Digest | int, target: Digest | None = None
) -> TableReconciliation:
    if isinstance(source, int):  # proven by row versions
        digest = Digest(source, None)
        return _result(
            table, sink, Proof.ROW_VERSIONS, digest, digest, True,
            f"The target holds exactly the snapshot's {source} rows: every one was written by "
            "the copy's own load and nobody changed a row since (row versions).",
        )  # fmt: skip
    assert target is not None
    passed, detail = _compare(table, source, target)
    return _result(table, sink, Proof.CONTENT_HASH, source, target, passed, detail)


def _compare(table: CopiedTable, source: Digest, target: Digest) -> tuple[bool, str]:
    """Whether the guarantee holds by the two digests, and what was found."""
    n, guarantee = source.count, table.guarantee
    if not table.target_exists:
        return False, f"The target table {table.target} does not exist."
    if guarantee is Guarantee.EQUAL:
        if source == target:
            return (
                True,
                f"The target holds exactly the snapshot's {n} rows (equal count and digest).",
            )
        same = "equal" if source.hash == target.hash else "differ"
        return False, (
            f"The target differs from the snapshot: {n} source rows, {target.count} target rows, "
            f"digests {same}."
        )
    if guarantee is Guarantee.CONTAINS:
        by_key, missing = f" (by primary key {', '.join(table.key)}).", n - target.count
        if source == target:
            return True, f"Every one of the snapshot's {n} rows is in the target, equal{by_key}"
        if missing > 0:
            return False, f"{missing} of the snapshot's {n} keys have no row in the target{by_key}"
        return False, f"Target rows with the snapshot's keys differ in value{by_key}"
    inserted = table.rows_inserted
    said = "" if inserted is None else f", and the sink inserted {inserted}"
    return target.count >= n and inserted in (None, n), (
        f"Counts only (the target has no primary key to compare values by): the target holds "
        f"{target.count} rows, the snapshot {n}{said}."
    )


def _result(
    table: CopiedTable, sink: Sink, proof: Proof, source: Digest, target: Digest, passed: bool,
    detail: str,
) -> TableReconciliation:  # fmt: skip
    if table.rows_extracted not in (None, source.count):
        passed = False
        detail += (
            f" The copy's extraction receipt counts {table.rows_extracted} rows where the "
            f"snapshot holds {source.count}: the copy did not read this snapshot."
        )
    return TableReconciliation(
        table.source, table.target, sink, table.guarantee, proof, source, target, passed, detail
    )
