"""The check's record of the keys each target transaction applied (:class:`KeyRecorder`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from psycopg import sql

from dpone_dagster.core.ledger_schema import LedgerTables
from dpone_dagster.core.sweep import row_estimate
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.target_plan import TablePlan

from .verify_whole import WHOLE_SHARE

KEYS_CHUNK = 10_000
"""Keys a recorded chunk holds: the check compares each chunk's digest on both sides, one round
trip each, and compares key by key only the chunks that differ."""


class KeyRecorder:
    """The hook that records, in the target transaction, the keys of each net effect applied
    (a changed key's old key too: it is staged as a delete), in chunks of :data:`KEYS_CHUNK`.

    Past the share of the table's rows that a whole-table check costs as much as
    (:data:`~.verify_whole.WHOLE_SHARE`) in one run, it records a mark instead of more keys
    (an empty chunk): the check then compares the whole table (:mod:`.verify_whole`).
    """

    def __init__(self, tables: LedgerTables, slot: str) -> None:
        self.tables, self.slot = tables, slot
        self._recorded: dict[TableName, tuple[int, int]] = {}

    def reset(self) -> None:
        """A new run: nothing recorded yet."""
        self._recorded.clear()

    def __call__(
        self, conn: Connection, plan: TablePlan, keys: sql.Composable, params: Sequence[object]
    ) -> None:
        if not plan.target_key:
            return  # a table without a primary key is checked whole
        recorded, limit = self._recorded.get(plan.source) or (0, _whole_limit(conn, plan))
        if recorded >= limit:
            return  # the mark is recorded: the whole table is compared
        names = [sql.Identifier(k) for k in plan.target_key]
        arrays = sql.SQL(", ").join(sql.SQL("array_agg({}::text)").format(n) for n in names)
        insert = self.tables.sql("INSERT INTO {replication_keys} (slot, source_table, key)")
        rows = conn.execute(
            insert + sql.SQL(
                " SELECT %s, %s, ARRAY[{}] FROM (SELECT {}, (row_number() OVER () - 1) / %s"
                " AS _dpone_chunk FROM {}) AS n GROUP BY _dpone_chunk"
                " RETURNING array_length(key, 2)"
            ).format(arrays, sql.SQL(", ").join(names), keys),
            (self.slot, plan.source.qualified, KEYS_CHUNK, *params),
        ).fetchall()  # fmt: skip
        recorded += sum(int(r[0] or 0) for r in rows)
        if recorded >= limit:
            conn.execute(insert + sql.SQL(" VALUES (%s, %s, '{}')"),
                         (self.slot, plan.source.qualified))  # fmt: skip
        self._recorded[plan.source] = (recorded, limit)


def _whole_limit(conn: Connection, plan: TablePlan) -> int:
    """The keys past which a run's check compares ``plan``'s whole table (from the target's
    row estimate; none while the target has no estimate)."""
    estimate = row_estimate(conn, plan.target)
    return max(1, estimate // WHOLE_SHARE) if estimate > 0 else sys.maxsize
