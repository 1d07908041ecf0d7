"""The registry of extraction strategies: one class per :class:`~.strategy.Strategy` name."""

from __future__ import annotations

from collections.abc import Mapping

from .batched_copy import BatchedCopyStrategy
from .internal_query import InternalQueryStrategy
from .options import Strategy
from .partitioned_copy import PartitionedCopyStrategy
from .strategy import ExtractionStrategy, SourceReads
from .stream_rows import StreamRowsStrategy
from .whole_copy import WholeCopyStrategy

STRATEGIES: Mapping[Strategy, type[ExtractionStrategy]] = {
    cls.name: cls
    for cls in (
        WholeCopyStrategy,
        StreamRowsStrategy,
        BatchedCopyStrategy,
        PartitionedCopyStrategy,
        InternalQueryStrategy,
    )
}
"""Every strategy's class, by name."""


def open_strategy(name: Strategy, reads: SourceReads) -> ExtractionStrategy:
    """The strategy ``name`` over ``reads``."""
    return STRATEGIES[name](reads)
