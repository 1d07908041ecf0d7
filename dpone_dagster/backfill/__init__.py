"""Ordered, checkpointed backfill: protocol (pure), ledger (PostgreSQL), copier. No Dagster.

Start with :class:`Backfill` and its :class:`BackfillOptions`. The backfill is the cursor engine's
fixed mark: the documents it returns are in :mod:`dpone_dagster.cursor.backfill_documents`, the
pure rules in :mod:`dpone_dagster.cursor.run_rules` (those of a copied batch, each named, in
:mod:`dpone_dagster.cursor.batch_rules`), its records in the ledger are
:class:`~dpone_dagster.cursor.cursor_ledger.RunLedger`'s. It stands on the shared core
(:mod:`dpone_dagster.core`: sessions, waits, in-flight evidence, read windows, the ledger store,
the error catalog) and never imports another engine; :func:`backfill_handoff` (the cursor engine's
handoff, :mod:`dpone_dagster.cursor.handoff`) hands a complete backfill to an incremental stream.
"""

from dpone_dagster.cursor.backfill_documents import (
    BACKFILL_PROTOCOL,
    ApplyPath,
    BackfillEffects,
    BackfillEvidence,
    BackfillProgress,
    BackfillRun,
    BackfillScope,
    BackfillStatus,
    BatchObservation,
    BatchReceipt,
    BatchRequest,
    Boundary,
    BoundedWritePause,
    MissingBoundary,
    TableRef,
    TrustworthyCursor,
)
from dpone_dagster.cursor.cursor_ledger import RunLedger
from dpone_dagster.cursor.handoff import backfill_handoff
from dpone_dagster.cursor.range_checks import (
    OnChanged,
    RangeCheck,
    RangeOutcome,
    ReconciliationReport,
)

from .api import Backfill
from .copier import BatchResult
from .options import BackfillOptions
from .results import BackfillReconciliationError, BackfillResult
from .state import ScopeState
from .target import PreparedTarget, prepare_target

__all__ = [
    "BACKFILL_PROTOCOL",
    "ApplyPath",
    "Backfill",
    "BackfillEffects",
    "BackfillEvidence",
    "BackfillOptions",
    "BackfillProgress",
    "BackfillReconciliationError",
    "BackfillResult",
    "BackfillRun",
    "BackfillScope",
    "BackfillStatus",
    "BatchObservation",
    "BatchReceipt",
    "BatchRequest",
    "BatchResult",
    "Boundary",
    "BoundedWritePause",
    "EngineError",
    "MissingBoundary",
    "OnChanged",
    "PreparedTarget",
    "RangeCheck",
    "RangeOutcome",
    "ReconciliationReport",
    "RunLedger",
    "ScopeState",
    "TableRef",
    "TrustworthyCursor",
    "backfill_handoff",
    "prepare_target",
]
