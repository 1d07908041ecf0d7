"""What a stream does with the target rows whose key the source lost: the one delete vocabulary."""

from __future__ import annotations

from dpone_dagster.lifecycle import Vocabulary

from .errors import EngineError


class Deletes(
    Vocabulary, option="deletes", refusal="incremental_options_invalid", error=EngineError
):
    """What happens to a target row whose key is gone from the source."""

    IGNORE = "ignore"
    """It stays."""
    HARD = "hard"
    """It is deleted."""
    SOFT = "soft"
    """It is kept and marked: its soft-delete column is set to when the run found it gone."""
    SWEEP = "sweep"
    """It is deleted when the stream's rolling sweep reaches its key range: a run's cost does
    not grow with the table, and a delete waits at most one full sweep (the sweep's
    ``ranges_total`` runs)."""
