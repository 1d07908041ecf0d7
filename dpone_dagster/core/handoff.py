"""A handoff between engines: a stream that starts where another engine's copy of its table ends.

An incremental stream with no state copies its table from the start, unless it is given a
:class:`Handoff`: a function that reads another engine's records in the ledger (the ordered
backfill's runs, say) and answers the high-water marks below which every source row of the
stream's table is already in the target. The stream starts at the greatest of them. The engines
never import each other: the stream knows only this protocol, and the user (or the Dagster
layer) passes the other engine's implementation, such as
:func:`dpone_dagster.backfill.backfill_handoff`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName

from .ledger import LedgerStore


@dataclass(frozen=True)
class StreamScope:
    """The tables and cursor of a stream, as another engine's records name them.

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
    """Answers where another engine's complete copy of a stream's table ends."""

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
            EngineError: ``incremental_backfill_incomplete`` when the other engine's copy is
                missing or not complete.
        """
        ...
