"""What a materialization, an observation and a check say: every ``dpone/`` key declared once,
in its job's set (:mod:`.keys`, gathered in :mod:`.sets`), dpone's receipts in Dagster's
vocabulary (:mod:`.receipts`) and the standard table set read from the target's catalog
(:mod:`.catalog`). The names below are imported on first use, so that a job's metadata loads
its own set, not every job's."""

from typing import TYPE_CHECKING

from dpone_dagster.lazy_names import lazy_names

if TYPE_CHECKING:
    from .sets import DponeMetadataSet, DponeRunTags

__all__ = ["DponeMetadataSet", "DponeRunTags"]

__getattr__, __dir__ = lazy_names(__name__, {"DponeMetadataSet": ".sets", "DponeRunTags": ".tags"})
