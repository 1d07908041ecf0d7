"""A stream's ``dpone_fresh`` check: :class:`FreshnessMetadataSet`."""

from .base import DponeSet


class FreshnessMetadataSet(DponeSet):
    """The ``dpone/`` keys of ``dpone_fresh``, the freshness policy of a stream (an
    incremental stream, a Kafka copy, a replicated table) judged by its lag (``dpone/lag_seconds``,
    :class:`~dpone_dagster.dagster.metadata.keys.common.CommonMetadataSet`'s).
    """

    fail_after_seconds: float | None = None
    """The lag beyond which the freshness policy fails, now (check of a stream's freshness)."""
    warn_after_seconds: float | None = None
    """The lag beyond which the freshness policy warns, when it has a warn window (check of a
    stream's freshness)."""
    freshness_policy: str | None = None
    """The policy judged, in words (check of a stream's freshness)."""
