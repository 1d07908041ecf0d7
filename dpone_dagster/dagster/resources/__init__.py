"""Dagster resources: the source, the target and the backfill ledger, with their event iterators."""

from .postgres import BackfillLedgerResource, PostgresSourceResource, PostgresTargetResource

__all__ = ["BackfillLedgerResource", "PostgresSourceResource", "PostgresTargetResource"]
