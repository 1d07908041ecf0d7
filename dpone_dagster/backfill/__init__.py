"""Ordered, checkpointed backfill: protocol (pure), ledger (PostgreSQL), copier. No Dagster.

Start with :class:`Backfill`; the documents it returns are in :mod:`.protocol`, the pure rules
in :mod:`.rules` (those of a copied batch, each named, in :mod:`.batch_rules`), the ledger in
:mod:`.ledger`, the sessions and their transactions in :mod:`.sessions`.
"""

from .api import DEFAULT_BATCH_SIZE, Backfill
from .copier import BatchResult
from .errors import BACKFILL_ERRORS, BackfillError, backfill_error
from .ledger import DEFAULT_LEDGER_SCHEMA, Ledger, LedgerConfig
from .protocol import (
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
from .reconcile_model import (
    ON_CHANGED,
    OnChanged,
    RangeCheck,
    RangeOutcome,
    ReconciliationReport,
    check_on_changed,
)
from .results import BackfillReconciliationError, BackfillResult
from .target import prepare_target

__all__ = [
    "BACKFILL_ERRORS",
    "BACKFILL_PROTOCOL",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_LEDGER_SCHEMA",
    "ON_CHANGED",
    "ApplyPath",
    "Backfill",
    "BackfillEffects",
    "BackfillError",
    "BackfillEvidence",
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
    "Ledger",
    "LedgerConfig",
    "MissingBoundary",
    "OnChanged",
    "RangeCheck",
    "RangeOutcome",
    "ReconciliationReport",
    "TableRef",
    "TrustworthyCursor",
    "backfill_error",
    "check_on_changed",
    "prepare_target",
]
