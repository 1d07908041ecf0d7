"""Incremental sync: keep a target table current with a source table, run after run. No Dagster.

Start with :class:`IncrementalSync` and its :class:`IncrementalOptions`. A run takes a mark
safe against late commits (:mod:`.mark`), copies ``(previous mark, mark]`` in ``(cursor, key)``
order through the one load path's ``merge`` sink in batches that commit with their receipts and
the stream's state (:mod:`.batch`; the documents are the cursor engine's
:mod:`~dpone_dagster.cursor.stream_documents`, kept by
:class:`~dpone_dagster.cursor.cursor_ledger.StreamLedger`), and finds deletes by comparing key
digests range by range (:mod:`.deletes`). It stands on the shared core
(:mod:`dpone_dagster.core`) and the cursor engine, and never imports another engine: a stream
that continues another engine's copy is given a :class:`~dpone_dagster.cursor.handoff.Handoff`.
"""

from dpone_dagster.core.verification import Verification
from dpone_dagster.cursor.cursor_ledger import StreamLedger
from dpone_dagster.cursor.stream_documents import (
    Checkpoint,
    RunInProgress,
    StreamReceipt,
    StreamState,
)
from dpone_dagster.reconcile.compare import Comparison

from .batch import BatchOutcome
from .engine import IncrementalSync
from .options import DEFAULT_FILLFACTOR, DEFAULT_SOFT_DELETE_COLUMN, IncrementalOptions
from .report import IncrementalResult, Notice
from .shape import StreamShape
from .sweep import CheckScope, Sweep, SweepPosition

__all__ = [
    "DEFAULT_FILLFACTOR",
    "DEFAULT_SOFT_DELETE_COLUMN",
    "BatchOutcome",
    "CheckScope",
    "Checkpoint",
    "Comparison",
    "IncrementalOptions",
    "IncrementalResult",
    "IncrementalSync",
    "Notice",
    "RunInProgress",
    "StreamLedger",
    "StreamReceipt",
    "StreamShape",
    "StreamState",
    "Sweep",
    "SweepPosition",
    "Verification",
]
