"""The handoff: the same engine, the next policy. A table copied under the fixed mark (a
complete backfill) continues under the moving mark (an incremental stream) from where the fixed
mark's runs end, instead of being copied again.

The fixed mark's runs of the same source and target tables with the same cursor, read from the
ledger (:class:`~.cursor_ledger.RunLedger`), must form one complete chain of partitions from the
start of the cursor's range (``(None, u1], (u1, u2], ...``), each ``succeeded``. The stream then
starts at the largest of their high-water marks: every row at or below it was copied (and
reconciled) by the backfill. :func:`backfill_handoff` is that rule; a stream may be given
another :class:`Handoff` of its own (its ``handoff=``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from dpone_dagster.core.errors import engine_error
from dpone_dagster.core.ledger import LedgerStore
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName

from .backfill_documents import BackfillRun, BackfillStatus
from .cursor_ledger import RunLedger


@dataclass(frozen=True)
class StreamScope:
    """The tables and cursor of a stream, as the other policy's records name them.

    Attributes:
        source_database: The source database's name.
        source: The source table.
        target_database: The target database's name.
        target: The target table.
        cursor: The cursor column.
    """

    source_database: str
    source: TableName
    target_database: str
    target: TableName
    cursor: str


class Handoff(Protocol):
    """Answers where an earlier complete copy of a stream's table ends."""

    def __call__(
        self, ledger: Connection, store: LedgerStore, scope: StreamScope
    ) -> Sequence[str | None]:
        """The high-water marks of the copies that together hold every row up to the greatest.

        Args:
            ledger: A session of the ledger's database, inside the caller's transaction.
            store: The ledger.
            scope: The stream's tables and cursor.

        Returns:
            The marks (``None`` for a copy that held no row); the stream starts at the
            greatest as the cursor's type orders them.

        Raises:
            EngineError: ``incremental_backfill_incomplete`` when the earlier copy is missing
                or not complete.
        """
        ...


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
    :class:`Handoff`).

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
