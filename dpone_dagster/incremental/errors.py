"""The incremental stream's error codes: one stable code, one message and next actions each.

A bad stream (``incremental_primary_key_missing``, ``incremental_cursor_invalid``,
``incremental_cursor_unindexed``, ``incremental_cursor_null``, ``incremental_target_key_differs``,
``incremental_options_invalid``) is refused when the run is planned, before anything is written.
``incremental_mark_unsettled`` is not raised: it names, in a run's notices, transactions that
were still open when the run's settle timeout ran out (the next runs read again from below them;
see :mod:`.mark`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from dpone_dagster.lifecycle import DponeError


class IncrementalError(DponeError):
    """A deliberate incremental-sync failure with a stable code (:data:`INCREMENTAL_ERRORS`)."""


INCREMENTAL_ERRORS: Final[dict[str, tuple[str, tuple[str, ...]]]] = {
    "incremental_options_invalid": (
        "The incremental stream's options are invalid.",
        ("Fix the option named in the message.",),
    ),
    "incremental_primary_key_missing": (
        "The source table has no primary key.",
        (
            "Add a primary key to the source table: the merge and the delete detection match "
            "rows by it.",
        ),
    ),
    "incremental_cursor_invalid": (
        "The cursor column is missing or of a type that cannot order a stream.",
        ("Name a column of type integer, numeric, date, timestamp or timestamptz.",),
    ),
    "incremental_cursor_unindexed": (
        "No index of the source table starts with the cursor column.",
        (
            "CREATE INDEX CONCURRENTLY ON the source table (cursor): without it every run "
            "scans the whole table.",
        ),
    ),
    "incremental_cursor_null": (
        "Rows of the source table have a NULL cursor: no run would ever copy them.",
        (
            "Fill the NULL cursor values and make the column NOT NULL (or choose another "
            "cursor), then run again.",
        ),
    ),
    "incremental_target_key_differs": (
        "The target table's primary key differs from the source's.",
        (
            "Give the target the source's primary key (same columns, same order), or copy into "
            "a new target table.",
        ),
    ),
    "incremental_backfill_incomplete": (
        "The stream cannot continue from the backfill: it is not complete.",
        (
            "Finish the backfill of every partition (backfill_asset), then run again; or run "
            "without continue_from_backfill to copy the table from the start.",
        ),
    ),
    "incremental_stream_stale": (
        "The stream's state changed under this run (another run advanced it).",
        ("Run again: the stream resumes from its newest durable state.",),
    ),
    "incremental_mark_unsettled": (
        "Transactions open when the mark was taken were still open after the settle timeout.",
        (
            "End the listed sessions (or set idle_in_transaction_session_timeout): until they "
            "end, each run reads again from the mark before they began, so none of their rows "
            "is lost, at the cost of re-reading that range.",
        ),
    ),
}
"""Every code with its default message and next actions."""


def incremental_error(
    code: str, detail: str | None = None, next_actions: Sequence[str] | None = None
) -> IncrementalError:
    """Builds the error for ``code`` with its catalogued message and next actions.

    Args:
        code: A key of :data:`INCREMENTAL_ERRORS`.
        detail: A sentence appended to the message (what exactly was found).
        next_actions: Replaces the catalogued next actions when given.

    Returns:
        The error, ready to raise.
    """
    return IncrementalError.from_catalog(INCREMENTAL_ERRORS, code, detail, next_actions)
