"""The skeleton every job's events share (:class:`JobEvents`): iterating them runs the job's
body (:meth:`JobEvents.run`), and a :class:`~dpone_dagster.lifecycle.DponeError` or a bare
``psycopg.Error`` it raises becomes the :class:`~dpone_dagster.DponeFailure` its job's coding
says (:class:`~dpone_dagster.dagster.failures.FailureCoding`: the side of a bare database
error, the job's outage code, the failure's metadata). No job's events translate a failure of
their own: a body raises the domain error, the skeleton fails the step with it.
"""

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import ClassVar, Generic, TypeVar

from dpone_dagster.dagster.failures import FailureCoding, dagster_failures

EventT = TypeVar("EventT", covariant=True)
"""What a job's events yield (materializations, checks)."""


class JobEvents(ABC, Generic[EventT]):
    """The events of one run of a job: iterating them runs :meth:`run`, and its failure is
    the step's :class:`~dpone_dagster.DponeFailure`, coded by the job's :attr:`coding`.

    A subclass is a frozen dataclass of the run's inputs (the resource methods return one)
    whose :meth:`run` yields its events.
    """

    coding: ClassVar[FailureCoding] = FailureCoding()
    """How the job codes its failure (the target's side and its codes by default)."""

    def __iter__(self) -> Iterator[EventT]:
        """Runs the job; yields its events as :meth:`run` yields them.

        Raises:
            DponeFailure: any error of the run, with its code and next actions (and the
                job's metadata on failure).
        """
        with dagster_failures(self.coding):
            yield from self.run()

    @abstractmethod
    def run(self) -> Iterator[EventT]:
        """The job's body: runs it and yields its events; raises its domain errors as they
        are (:class:`~dpone_dagster.lifecycle.DponeError`, ``psycopg.Error``)."""
