"""What a materialization, an observation and a check say: every ``dpone/`` key declared once
(:mod:`.sets`), dpone's receipts in Dagster's vocabulary (:mod:`.receipts`) and the standard
table set read from the target's catalog (:mod:`.catalog`)."""

from .sets import DponeMetadataSet, DponeRunTags

__all__ = ["DponeMetadataSet", "DponeRunTags"]
