"""Continuing a stream from a complete backfill of the same table (``continue_from_backfill``).

The backfill's runs of the same source and target tables with the same cursor, read from the
ledger, must form one complete chain of partitions from the start of the cursor's range
(``(None, u1], (u1, u2], ...``), each ``succeeded``. The stream then starts at the largest of
their high-water marks: every row at or below it was copied (and reconciled) by the backfill.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from dpone_dagster.backfill.ledger import Ledger
from dpone_dagster.backfill.protocol import BackfillRun, BackfillStatus

from .errors import incremental_error
from .plan import greatest
from .shape import StreamShape

Conn = psycopg.Connection[tuple[object, ...]]


def _runs(
    tgt: Conn, ledger: Ledger, shape: StreamShape, databases: tuple[str, str]
) -> list[BackfillRun]:
    rows = tgt.execute(sql.SQL("SELECT run_json FROM {}").format(ledger.runs)).fetchall()
    runs = [BackfillRun.model_validate(r[0]) for r in rows]
    source_db, target_db = databases
    return [
        r for r in runs
        if (r.scope.source.database, r.scope.source.schema_name, r.scope.source.name)
        == (source_db, shape.source.schema, shape.source.name)
        and (r.scope.target.database, r.scope.target.schema_name, r.scope.target.name)
        == (target_db, shape.target.schema, shape.target.name)
        and r.scope.cursor == shape.cursor.name
    ]  # fmt: skip


def backfill_mark(
    src: Conn, tgt: Conn, ledger: Ledger, shape: StreamShape, databases: tuple[str, str]
) -> str | None:
    """The mark a stream continues from: the complete backfill's largest high-water mark.

    Args:
        src: A source session (compares cursor values).
        tgt: A target session in a transaction (reads the ledger).
        ledger: The backfill ledger.
        shape: The stream.
        databases: The source's and the target's database names.

    Raises:
        IncrementalError: ``incremental_backfill_incomplete`` when no backfill of the table with
            this cursor is in the ledger, a partition is not ``succeeded``, or the partitions do
            not chain from the start.
    """
    runs = _runs(tgt, ledger, shape, databases)
    if not runs:
        raise incremental_error(
            "incremental_backfill_incomplete",
            f"The ledger has no backfill of {shape.source} into {shape.target} with cursor "
            f"{shape.cursor.name!r}.",
        )
    unfinished = [r.scope.label or r.run_id for r in runs if r.status != BackfillStatus.SUCCEEDED]
    if unfinished:
        raise incremental_error(
            "incremental_backfill_incomplete",
            f"{len(unfinished)} backfill partition run(s) are not succeeded: "
            f"{', '.join(sorted(unfinished)[:5])}.",
        )
    by_lower = {r.scope.lower: r for r in runs}
    chained, lower = [], None
    while lower in by_lower:
        run = by_lower.pop(lower)
        chained.append(run)
        lower = run.scope.upper
        if lower is None:
            break
    if not chained or by_lower:
        raise incremental_error(
            "incremental_backfill_incomplete",
            "The backfill's partitions do not form one chain from the start of the cursor's "
            f"range ({len(runs)} run(s), {len(chained)} chained).",
        )
    return greatest(
        src, shape, [getattr(r.boundary, "source_high_water_mark", None) for r in chained]
    )
