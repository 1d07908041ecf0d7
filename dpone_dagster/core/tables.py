"""What every engine resolves before it copies: a source table, its target, the columns that
move and the cursor that orders them."""

from __future__ import annotations

from dataclasses import dataclass

from dpone_dagster.postgres.catalog import Column
from dpone_dagster.postgres.identifiers import TableName


@dataclass(frozen=True)
class TablePair:
    """A resolved source/target pair (each engine's shape adds its key and its own facts).

    Attributes:
        source: The source table.
        target: The target table.
        columns: The copied columns (the source's, generated ones left out).
        cursor: The cursor column (one of the copied columns).
    """

    source: TableName
    target: TableName
    columns: tuple[Column, ...]
    cursor: Column
