"""Dagster components: declare dpone copies and backfills in a ``defs.yaml``."""

from .postgres_copy.component import PostgresCopyComponent

__all__ = ["PostgresCopyComponent"]
