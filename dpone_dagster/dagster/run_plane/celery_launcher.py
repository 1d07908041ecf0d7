"""A Celery run launcher whose health check also notices a worker host that died.

dagster-celery's ``CeleryRunLauncher`` judges a started run by its Celery task's state. When the
pool process running the task is killed, the worker's main process records ``FAILURE`` and the
daemon's run monitor fails the run (then run retries relaunch it). When the whole worker host
disappears (machine lost, container OOM-killed, ``kill -9`` of the main process), nobody records
anything: the task stays ``STARTED`` forever, the run holds its concurrency-pool slot, and only
``max_runtime_seconds`` would end it.

This launcher adds one check for a run whose task says ``STARTED``: the worker named in the
task's record must answer a Celery ``ping`` through the broker. After ``missed_pings`` checks in
a row without an answer the run is reported ``FAILED``, and Dagster's run monitoring and run
retries take it from there. A worker that was only slow and comes back finds its run failed and
retried; the ledger (advisory lock, revision compare-and-swap) makes that overlap harmless.

Install with the ``celery`` extra (``pip install 'dpone-dagster[celery]'``) and name it in
``dagster.yaml`` (``deploy/celery/dagster.yaml``)::

    run_launcher:
      module: dpone_dagster.dagster.run_plane.celery_launcher
      class: CeleryRunLauncher
      config:
        broker: {env: DAGSTER_CELERY_BROKER_URL}
        backend: {env: DAGSTER_CELERY_BACKEND_URL}
        worker_ping_timeout_seconds: 2
        missed_pings: 3
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from dagster import DagsterRun, Field

# No public names in dagster 1.13 for what a run launcher's health check returns or for its
# instance data: these are the modules dagster-celery's own launcher imports them from.
from dagster._core.launcher import CheckRunHealthResult, WorkerStatus
from dagster._serdes import ConfigurableClassData
from dagster_celery.launcher import CeleryRunLauncher as _CeleryRunLauncher
from dagster_celery.tags import DAGSTER_CELERY_TASK_ID_TAG

DEFAULT_PING_TIMEOUT_SECONDS = 2.0
DEFAULT_MISSED_PINGS = 3


class CeleryRunLauncher(_CeleryRunLauncher):
    """dagster-celery's run launcher, plus a liveness ping of the worker that holds a run.

    Args:
        worker_ping_timeout_seconds: How long one check waits for the worker's answer.
        missed_pings: Checks in a row without an answer before the run is reported failed.
        **kwargs: dagster-celery's settings (``broker``, ``backend``, ``default_queue``,
            ``include``, ``config_source``).
    """

    def __init__(
        self,
        worker_ping_timeout_seconds: float = DEFAULT_PING_TIMEOUT_SECONDS,
        missed_pings: int = DEFAULT_MISSED_PINGS,
        inst_data: ConfigurableClassData | None = None,
        **kwargs: Any,
    ) -> None:
        if worker_ping_timeout_seconds <= 0 or missed_pings < 1:
            raise ValueError(
                "worker_ping_timeout_seconds must be positive and missed_pings at least 1, not "
                f"{worker_ping_timeout_seconds} and {missed_pings}."
            )
        self.worker_ping_timeout_seconds = float(worker_ping_timeout_seconds)
        self.missed_pings = missed_pings
        self._misses: dict[str, int] = {}
        self._lock = threading.Lock()
        super().__init__(inst_data=inst_data, **kwargs)

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        """The task's state, and for a started task whether its worker still answers."""
        health = super().check_run_worker_health(run)
        if health.status is not WorkerStatus.RUNNING:
            self._forget(run.run_id)
            return health
        info = self.celery.AsyncResult(run.tags[DAGSTER_CELERY_TASK_ID_TAG]).info
        hostname = info.get("hostname") if isinstance(info, Mapping) else None
        if not hostname:
            return health
        if self._answers(str(hostname)):
            self._forget(run.run_id)
            return health
        with self._lock:
            misses = self._misses[run.run_id] = self._misses.get(run.run_id, 0) + 1
        if misses < self.missed_pings:
            return health
        self._forget(run.run_id)
        return CheckRunHealthResult(
            WorkerStatus.FAILED,
            f"Celery worker {hostname} answered no ping in {misses} checks in a row "
            f"({self.worker_ping_timeout_seconds:g}s each): its host is gone.",
        )

    def _answers(self, hostname: str) -> bool:
        replies = self.celery.control.ping(
            destination=[hostname], timeout=self.worker_ping_timeout_seconds, limit=1
        )
        return any(hostname in reply for reply in replies or [])

    def _forget(self, run_id: str) -> None:
        with self._lock:
            self._misses.pop(run_id, None)

    @classmethod
    def config_type(cls) -> Any:
        """dagster-celery's settings plus the liveness check's two."""
        upstream = super().config_type()
        assert isinstance(upstream, Mapping)
        return {
            **upstream,
            "worker_ping_timeout_seconds": Field(
                float,
                is_required=False,
                default_value=DEFAULT_PING_TIMEOUT_SECONDS,
                description="How long one health check waits for the worker's ping answer.",
            ),
            "missed_pings": Field(
                int,
                is_required=False,
                default_value=DEFAULT_MISSED_PINGS,
                description="Health checks in a row without an answer before the run fails.",
            ),
        }
