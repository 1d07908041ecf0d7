"""What the benchmarks time of a Dagster run: a warm ``dagster.materialize``, or a cold process.

:func:`timed_materialize` runs a warm-up materialization of a trivial asset first, so its figure
leaves out what a run worker has loaded before its first step (Dagster's imports, its instance).
:func:`materialize_definitions` is what a cold process runs (``bench/pipe.py``'s
:func:`~bench.pipe.cold_process` times the whole process): it builds the ``Definitions`` and
executes their asset job, as a run worker does after importing Dagster and the code location.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any


def _passed(result: Any) -> Any:
    """The result of a materialization that succeeded with every check passing.

    Raises:
        SystemExit: the materialization failed or one of its checks did not pass (a warning
            that a check verified nothing this run is not a failure).
    """
    checks = result.get_asset_check_evaluations()
    if not result.success or not all(c.passed or _verified_nothing(c) for c in checks):
        raise SystemExit(f"the materialization failed or its check did not pass: {checks}")
    return result


def _verified_nothing(check: Any) -> bool:
    """A check's warning that it verified nothing this run (a run stopped by its budget)."""
    import dagster as dg

    verified = check.metadata.get("dpone/verified")
    return (
        check.severity == dg.AssetCheckSeverity.WARN and getattr(verified, "value", None) is False
    )


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
    return seconds, _passed(result)


def materialize_definitions(
    assets: Sequence[Any], resources: Mapping[str, Any], **kwargs: Any
) -> Any:
    """Builds ``Definitions(assets, resources)`` and executes their asset job in this process
    (``execute_in_process(**kwargs)``, an ephemeral instance): a cold run worker's whole run.

    Raises:
        SystemExit: the materialization failed or one of its checks did not pass.
    """
    import dagster as dg

    defs = dg.Definitions(assets=list(assets), resources=dict(resources))
    job = defs.resolve_implicit_global_asset_job_def()
    return _passed(job.execute_in_process(**kwargs))
