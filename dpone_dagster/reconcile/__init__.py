"""The one reconciliation: does the target hold what the source held? No Dagster.

One server-side digest (:mod:`.digest`: a count and an order-independent sum of exact per-row
hashes, computed by each server over its own rows) and two provers that use it or spare it:
the content hash itself, and row versions (:mod:`.row_versions`), which prove rows nobody touched
since their copy without reading them. A snapshot copy's check (:func:`reconcile_copy`) and the
backfill's final per-range reconciliation (:mod:`dpone_dagster.backfill.reconcile`) are both
built on them.
"""

from .copy_check import ReconcileError, reconcile_copy
from .copy_verdict import Guarantee, TableReconciliation
from .digest import DIGEST_ALGORITHM, Digest, DigestError
from .proof import Proof

__all__ = [
    "DIGEST_ALGORITHM",
    "Digest",
    "DigestError",
    "Guarantee",
    "Proof",
    "ReconcileError",
    "TableReconciliation",
    "reconcile_copy",
]
