"""JSON Schema of every backfill document: ``python -m dpone_dagster.backfill.schema``.

The schema is what another system (an auditor, a dashboard, a service in another language)
needs to read runs and receipts out of the ledger without importing this package.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from dpone_dagster.cursor.backfill_documents import (
    BACKFILL_PROTOCOL,
    BackfillEffects,
    BackfillEvidence,
    BackfillProgress,
    BackfillRun,
    BackfillScope,
    BatchObservation,
    BatchReceipt,
    BatchRequest,
    BoundedWritePause,
    MissingBoundary,
    TrustworthyCursor,
)
from dpone_dagster.cursor.range_checks import RangeCheck, ReconciliationReport

SCHEMA_MODELS: tuple[type[BaseModel], ...] = (
    BackfillRun,
    BackfillScope,
    TrustworthyCursor,
    BoundedWritePause,
    MissingBoundary,
    BackfillProgress,
    BackfillEvidence,
    BackfillEffects,
    BatchRequest,
    BatchObservation,
    BatchReceipt,
    RangeCheck,
    ReconciliationReport,
)


def json_schema() -> dict[str, Any]:
    """One JSON Schema document whose ``$defs`` hold every backfill model."""
    _, schema = models_json_schema(
        [(model, "validation") for model in SCHEMA_MODELS],
        title=f"{BACKFILL_PROTOCOL} documents",
    )
    return schema


def main() -> None:
    """Prints :func:`json_schema` as indented JSON."""
    print(json.dumps(json_schema(), indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
