"""How many rows a batch takes when the caller does not say: about :data:`BATCH_BYTES` of the table.

Every batch pays the same fixed work beside its rows (the run's lock and ledger reads, its
snapshot and bounds, its receipt and COMMIT, the pipe between the servers filling and draining),
so a batch of a fixed row count costs a narrow table (a few dozen bytes a row) many times what
it costs a wide one. Instead, the plan sizes the batches from the source table's width: its
size on disk (``pg_table_size``: heap and TOAST) over the server's estimate of its rows
(``pg_class.reltuples``), so that a batch reads about :data:`BATCH_BYTES`, within
:data:`MIN_ROWS` and :data:`MAX_ROWS`. A table the server has no estimate for yet (never
vacuumed or analyzed) gets :data:`~dpone_dagster.postgres.options.BACKFILL_BATCH_SIZE`.

The size is chosen once, when the run is planned, and kept in the run as evidence (kind
``batch_size``): every orchestrator of the run (a retry, a second worker racing it) then asks
for the same batches, whose requests (and digests) are equal, so a batch one of them committed
is a replay for the other, never a changed batch. A size the caller gives explicitly wins.
"""

from __future__ import annotations

from typing import Final

from dpone_dagster.cursor.backfill_documents import BackfillEvidence, BackfillRun
from dpone_dagster.cursor.run_rules import digest
from dpone_dagster.postgres.catalog import relation_oid
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.options import BACKFILL_BATCH_SIZE, BatchSize

from .shape import TableShape

BATCH_BYTES: Final = 64 << 20
"""The source bytes a batch reads when its size is chosen from the table's width."""
MIN_ROWS: Final = 1_000
"""The fewest rows a batch sized from the width takes (a table of very wide rows)."""
MAX_ROWS: Final = 2_000_000
"""The most rows a batch sized from the width takes (a table of very narrow rows)."""
EVIDENCE_KIND: Final = "batch_size"
"""The run evidence that holds the batch size chosen at the plan."""

_WIDTH = """SELECT pg_table_size(c.oid), c.reltuples FROM pg_class AS c
WHERE c.oid = %s::bigint::oid"""


def width_batch_size(src: Connection, shape: TableShape) -> BackfillEvidence | None:
    """The batch size of ``shape``'s source table from its width, as the run's evidence; None
    when the server has no estimate of its rows (the default size then applies)."""
    oid = relation_oid(src, shape.source)
    found = None if oid is None else src.execute(_WIDTH, (oid,)).fetchone()
    if found is None or found[0] is None or float(found[1]) <= 0:
        return None
    size, rows = int(found[0]), float(found[1])
    per_row = max(size / rows, 1.0)
    chosen = min(max(int(BATCH_BYTES / per_row), MIN_ROWS), MAX_ROWS)
    return BackfillEvidence(
        kind=EVIDENCE_KIND,
        subject=str(chosen),
        digest=digest({"table_bytes": size, "estimated_rows": rows}),
        detail=f"{chosen:,} rows a batch: about {BATCH_BYTES >> 20} MiB of {shape.source} at "
        f"{per_row:,.0f} bytes a row ({size:,} bytes over an estimated {rows:,.0f} rows).",
    )


def batch_size_for(run: BackfillRun, explicit: BatchSize | None) -> BatchSize:
    """The size of the run's next batch: the caller's, else the one chosen at the plan, else
    :data:`~dpone_dagster.postgres.options.BACKFILL_BATCH_SIZE` (a run planned without one)."""
    if explicit is not None:
        return explicit
    for evidence in run.evidence:
        if evidence.kind == EVIDENCE_KIND:
            return BatchSize(int(evidence.subject))
    return BACKFILL_BATCH_SIZE
