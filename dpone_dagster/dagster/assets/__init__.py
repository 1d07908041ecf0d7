"""Asset factories: snapshot copies (one multi-asset per snapshot), partitioned backfills and
incremental streams."""

from .backfill import backfill_asset
from .incremental import incremental_asset
from .snapshot_copy import snapshot_copy_assets

__all__ = ["backfill_asset", "incremental_asset", "snapshot_copy_assets"]
