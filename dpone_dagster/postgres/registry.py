"""The registry of extraction strategies: one class per :class:`~.strategy.Strategy` name."""

from __future__ import annotations

from collections.abc import Mapping

from .batched_copy import BatchedCopyStrategy
from .internal_query import InternalQueryStrategy
from .partitioned_copy import PartitionedCopyStrategy
from .strategy import ExtractionStrategy, SourceReads, Strategy, check_strategy
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


def open_strategy(name: Strategy | str, reads: SourceReads) -> ExtractionStrategy:
    """The strategy named ``name`` over ``reads``.

    Raises:
        CopyPlanError: ``copy_options_invalid`` for a name that is not a :class:`Strategy`.
    """
    return STRATEGIES[check_strategy(name)](reads)
