"""Handing a complete backfill to an incremental stream (the stream's ``handoff``).

The backfill's runs of the same source and target tables with the same cursor, read from the
ledger, must form one complete chain of partitions from the start of the cursor's range
(``(None, u1], (u1, u2], ...``), each ``succeeded``. The stream then starts at the largest of
their high-water marks: every row at or below it was copied (and reconciled) by the backfill.
"""

from __future__ import annotations

from dpone_dagster.core.errors import engine_error
from dpone_dagster.core.handoff import StreamScope
from dpone_dagster.core.ledger import LedgerStore
from dpone_dagster.cursor.backfill_documents import BackfillRun, BackfillStatus
from dpone_dagster.cursor.cursor_ledger import RunLedger
from dpone_dagster.postgres.connection import Connection


def _runs(ledger: Connection, store: LedgerStore, scope: StreamScope) -> list[BackfillRun]:
    runs = RunLedger(store.schema).runs(ledger)
    source = (scope.source_database, scope.source.schema, scope.source.name)
    target = (scope.target_database, scope.target.schema, scope.target.name)
    return [
        r for r in runs
        if (r.scope.source.database, r.scope.source.schema_name, r.scope.source.name) == source
        and (r.scope.target.database, r.scope.target.schema_name, r.scope.target.name) == target
        and r.scope.cursor == scope.cursor
    ]  # fmt: skip


def backfill_handoff(
    ledger: Connection, store: LedgerStore, scope: StreamScope
) -> list[str | None]:
    """The high-water marks of the complete backfill of the stream's table (a
    :class:`~dpone_dagster.core.handoff.Handoff`).

    Args:
        ledger: A session of the ledger's database, inside the caller's transaction.
        store: The ledger.
        scope: The stream's tables and cursor.

    Raises:
        EngineError: ``incremental_backfill_incomplete`` when no backfill of the table with
            this cursor is in the ledger, a partition is not ``succeeded``, or the partitions do
            not chain from the start.

    Examples:
        Start a stream where the backfill of ``shop.orders`` ended::

            IncrementalSync(src, dst, "shop.orders", cursor="id", handoff=backfill_handoff)
    """
    runs = _runs(ledger, store, scope)
    if not runs:
        raise engine_error(
            "incremental_backfill_incomplete",
            f"The ledger has no backfill of {scope.source} into {scope.target} with cursor "
            f"{scope.cursor!r}.",
        )
    unfinished = [r.scope.label or r.run_id for r in runs if r.status != BackfillStatus.SUCCEEDED]
    if unfinished:
        raise engine_error(
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
        raise engine_error(
            "incremental_backfill_incomplete",
            "The backfill's partitions do not form one chain from the start of the cursor's "
            f"range ({len(runs)} run(s), {len(chained)} chained).",
        )
    return [getattr(r.boundary, "source_high_water_mark", None) for r in chained]
