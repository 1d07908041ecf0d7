"""Asset factories: snapshot copies (one multi-asset per snapshot) and partitioned backfills."""

from .backfill import backfill_asset
from .snapshot_copy import snapshot_copy_assets

__all__ = ["backfill_asset", "snapshot_copy_assets"]
