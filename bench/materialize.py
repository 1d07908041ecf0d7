"""What the benchmarks time of a Dagster run: one ``dagster.materialize`` in this process.

A warm-up materialization of a trivial asset comes first, so the figure leaves out what a run
worker has loaded before its first step (Dagster's imports, its instance).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any


def timed_materialize(
    assets: Sequence[Any], resources: Mapping[str, Any], **kwargs: Any
) -> tuple[float, Any]:
    """Seconds of ``dagster.materialize(assets, resources=resources, **kwargs)`` and its result.

    Raises:
        SystemExit: the materialization failed or one of its checks did not pass.
    """
    import dagster as dg

    @dg.asset
    def warm_up() -> None:
        """Loads what a run worker has loaded before its first step."""

    assert dg.materialize([warm_up]).success
    started = time.perf_counter()
    result = dg.materialize(list(assets), resources=dict(resources), **kwargs)
    seconds = time.perf_counter() - started
    checks = result.get_asset_check_evaluations()
    if not result.success or not all(c.passed for c in checks):
        raise SystemExit(f"the materialization failed or its check did not pass: {checks}")
    return seconds, result
