"""How a reconciliation established that the target equals the source."""

from __future__ import annotations

from enum import StrEnum


class Proof(StrEnum):
    """The prover that established a comparison (a table's, or a backfill batch range's)."""

    CONTENT_HASH = "content_hash"
    """Both servers digested the exact content of the rows (:mod:`.digest`)."""
    ROW_VERSIONS = "row_versions"
    """Nobody wrote the rows on either side since they were copied (:mod:`.row_versions`): the
    target holds what the copy's COPY stream carried, without a value being read."""
