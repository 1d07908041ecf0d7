"""Asset factories: snapshot copies (one multi-asset per snapshot) and partitioned backfills."""

from .backfill import backfill_asset

__all__ = ["backfill_asset"]
