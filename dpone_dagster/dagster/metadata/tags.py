"""Every ``dpone/`` tag of runs and ops, declared once: :class:`DponeRunTags`."""

# No public name in dagster 1.13: the module Dagster's own tag sets come from.
from dagster._core.definitions.tags import NamespacedTagSet
from pydantic import ConfigDict

from .keys.base import NAMESPACE


class DponeRunTags(NamespacedTagSet):
    """dpone's tags of runs and ops, one field per ``dpone/`` tag (tags are text).

    Examples:
        >>> dict(DponeRunTags(source_table="shop.orders"))
        {'dpone/source_table': 'shop.orders'}
    """

    model_config = ConfigDict(strict=True, use_attribute_docstrings=True)

    source_table: str | None = None
    """The source table a backfill's or a stream's op, or an extraction job, reads (op tag,
    job tag)."""
    partition: str | None = None
    """The partition a backfill run is copying (run tag, while it runs)."""
    slot: str | None = None
    """The replication slot a drop job drops (job tag, op tag)."""
    checkpoint: str | None = None
    """The newest committed batch's checkpoint, short (``sha256:`` and its first 12 hex
    digits; the materialization holds it whole) (run tag, while a backfill runs)."""
    copied: str | None = None
    """Rows the run's batches copied so far, every partition of the run together (run tag,
    while a backfill runs)."""
    partitions_done: str | None = None
    """Partitions of the run done, of how many: ``3 of 31`` (run tag, while a backfill
    runs)."""

    @classmethod
    def namespace(cls) -> str:
        """``dpone``."""
        return NAMESPACE
