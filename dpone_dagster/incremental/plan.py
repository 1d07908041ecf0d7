"""Planning a run: from the stream's durable state and a fresh mark to the run's range.

A run copies ``(lower, mark]``. ``lower`` is the stream's mark, or, while transactions that were
open at an earlier mark are still open, the bound the stream kept for them (``rescan_from``,
see :mod:`.mark`), minus the ``lookback`` for time cursors. The mark never moves backwards: if
the newest rows were deleted, the stream's mark stays where it was.
"""

from __future__ import annotations

from datetime import timedelta

from psycopg import sql

from dpone_dagster.core.deletes import Deletes
from dpone_dagster.core.marks import Mark
from dpone_dagster.cursor.stream_documents import RunInProgress, StreamState
from dpone_dagster.postgres.connection import Connection

from .shape import StreamShape


def greatest(src: Connection, shape: StreamShape, values: list[str | None]) -> str | None:
    """The largest of ``values`` as the cursor's type (``None`` when all are ``None``)."""
    present = [v for v in values if v is not None]
    if len(present) < 2:
        return present[0] if present else None
    row = src.execute(
        sql.SQL("SELECT max(CAST(v AS {}))::text FROM unnest(%s::text[]) AS v").format(
            sql.SQL(shape.cursor.type_sql)
        ),
        (present,),
    ).fetchone()
    assert row is not None
    return None if row[0] is None else str(row[0])


def above(src: Connection, shape: StreamShape, values: list[str], mark: str | None) -> list[bool]:
    """For each cursor value (text), whether it lies above ``mark`` (every one, without a
    mark)."""
    if mark is None or not values:
        return [True] * len(values)
    rows = src.execute(
        sql.SQL(
            "SELECT CAST(v AS {t}) > CAST(%s::text AS {t}) FROM unnest(%s::text[])"
            " WITH ORDINALITY AS u(v, n) ORDER BY n"
        ).format(t=sql.SQL(shape.cursor.type_sql)),
        (mark, values),
    ).fetchall()
    return [bool(r[0]) for r in rows]


def _minus(src: Connection, shape: StreamShape, value: str, lookback: timedelta) -> str:
    row = src.execute(
        sql.SQL("SELECT (CAST(%s::text AS {}) - %s::interval)::text").format(
            sql.SQL(shape.cursor.type_sql)
        ),
        (value, lookback),
    ).fetchone()
    assert row is not None
    return str(row[0])


def next_lower(
    src: Connection, shape: StreamShape, state: StreamState, lookback: timedelta | None
) -> str | None:
    """Where the stream's next run starts reading: the mark, or below it where transactions
    were still open at the mark (``rescan_from``), less the lookback."""
    lower = state.rescan_from if state.unsettled else state.mark
    if lookback is not None and lower is not None:
        lower = _minus(src, shape, lower, lookback)
    return lower


def plan_run(
    src: Connection,
    shape: StreamShape,
    state: StreamState,
    mark: Mark,
    lookback: timedelta | None,
) -> RunInProgress:
    """The next run of ``state`` up to ``mark``.

    Args:
        src: A source session (autocommit, digest settings pinned).
        shape: The stream.
        state: The stream's durable state (no run in progress).
        mark: The fresh mark.
        lookback: How far below the lower bound a time cursor is read again.
    """
    kept = state.rescan_from if state.unsettled else state.mark
    lower = next_lower(src, shape, state, lookback)
    rescan_from = None
    if mark.unsettled:  # still open: read from below them again next time
        rescan_from = kept if set(mark.unsettled) & set(state.unsettled) else state.mark
    return RunInProgress(
        number=state.runs + 1,
        lower=lower,
        mark=greatest(src, shape, [state.mark, mark.mark]),
        taken_at=mark.taken_at,
        snapshot_token_digest=mark.snapshot_token_digest,
        unsettled=mark.unsettled,
        rescan_from=rescan_from,
        awaited=mark.awaited,
    )


def nothing_to_do(state: StreamState, run: RunInProgress, deletes: Deletes) -> bool:
    """True when a run would neither copy, re-read nor compare anything: no state is written
    (``sweep`` deletes: a slice of the sweep may still find some, and then a run begins)."""
    return (
        deletes in (Deletes.IGNORE, Deletes.SWEEP)  # a sweep's slice needs no batch
        and not state.unsettled
        and not run.unsettled
        and run.mark == state.mark
        and run.lower == state.mark
    )
