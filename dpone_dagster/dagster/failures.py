"""Run-time errors as Dagster failures that carry the stable code and the next actions: a
run's :class:`DponeError`, or a bare ``psycopg.Error`` coded as its job codes it
(:class:`FailureCoding`), becomes a :class:`DponeFailure`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import dagster as dg
import psycopg

from dpone_dagster.core.errors import engine_error
from dpone_dagster.dagster.metadata.keys.base import bullets
from dpone_dagster.dagster.metadata.keys.common import CommonMetadataSet, FailureMetadataSet
from dpone_dagster.lifecycle import DponeError, redact
from dpone_dagster.postgres.failures import FailureSide, database_error

ERROR_CODE_KEY = FailureMetadataSet.key("error_code")
"""``dpone/error_code``: the failure's stable code."""
NEXT_ACTIONS_KEY = CommonMetadataSet.key("next_actions")
"""``dpone/next_actions``: what the person on call can do next."""


def headline(error: DponeError) -> str:
    """The first line a person reads of ``error``: its code, its message and its first next
    action, on one line (the message's own line breaks folded).

    Examples:
        >>> headline(DponeError("table_not_found", "No table shop.x.", ["Check the name.", "Or"]))
        '[table_not_found] No table shop.x. Next: Check the name.'
    """
    text = f"[{error.code}] {' '.join(error.message.split())}"
    if error.next_actions:
        text += f" Next: {' '.join(error.next_actions[0].split())}"
    return text


def failure_description(error: DponeError) -> str:
    """A :class:`DponeFailure`'s description: :func:`headline` on its first line (what the CLI
    prints after the exception's name and the UI shows first in the step's failure), then every
    next action, one per line."""
    actions = bullets(error.next_actions)
    return headline(error) + (f"\n\nNext actions:\n{actions}" if actions else "")


class DponeFailure(dg.Failure):
    """A :class:`dagster.Failure` raised for a :class:`~dpone_dagster.lifecycle.DponeError`.

    The failure's first line is the error's code, message and first next action
    (:func:`headline`): the line the CLI prints and the UI shows first in the step's failure;
    every next action follows, one per line. Its metadata holds ``dpone/error_code`` (stable, for
    alerting rules) and ``dpone/next_actions`` (for the person on call).

    Args:
        error: The domain error.
        metadata: More metadata for the failure event (a terminal outcome, a partition).
    """

    def __init__(self, error: DponeError, metadata: Mapping[str, Any] | None = None) -> None:
        self.error = error
        actions = bullets(error.next_actions) or "-"
        failure = {
            **FailureMetadataSet(error_code=error.code),
            **CommonMetadataSet(next_actions=dg.MetadataValue.md(actions)),
        }
        super().__init__(
            description=failure_description(error),
            metadata={**failure, **(metadata or {})},
        )

    @property
    def code(self) -> str:
        """The stable error code."""
        return self.error.code


@dataclass(frozen=True)
class FailureCoding:
    """How a job codes its run's failure (:meth:`failure`).

    Args:
        side: The side whose session raised a bare ``psycopg.Error``: the engines code their
            own database errors, so a bare one comes from the step's own statements (its
            metadata reads, a check of the ledger's database).
        outage: The job's code for a database failure that no kind names (a lost connection,
            a server shut down); ``None``: the side's own (``source_read_failed``,
            ``target_load_failed``).
        metadata: More metadata for the failure, from its error (a copy's terminal outcome).
    """

    side: FailureSide = "target"
    outage: str | None = None
    metadata: Callable[[DponeError], Mapping[str, Any]] | None = None

    def failure(self, exc: DponeError | psycopg.Error) -> DponeFailure:
        """The :class:`DponeFailure` of ``exc``: a :class:`DponeError` as it is, a
        ``psycopg.Error`` as the stable error of a database failure on :attr:`side`
        (:func:`~dpone_dagster.postgres.failures.database_error`, :attr:`outage` for one that
        no kind names), with the job's :attr:`metadata`."""
        if isinstance(exc, psycopg.Error):
            cause = redact(str(exc)).strip()
            outage = None if self.outage is None else engine_error(self.outage, cause)
            error = database_error(exc, self.side, outage=outage)
        else:
            error = exc
        return DponeFailure(error, None if self.metadata is None else self.metadata(error))


@contextmanager
def dagster_failures(coding: FailureCoding | None = None) -> Iterator[None]:
    """Re-raises a :class:`DponeError` of the block as a :class:`DponeFailure`; given the
    job's ``coding``, a bare ``psycopg.Error`` too, coded as :meth:`FailureCoding.failure`
    says (without one, a ``psycopg.Error`` passes as it is)."""
    caught = (DponeError,) if coding is None else (DponeError, psycopg.Error)
    try:
        yield
    except caught as exc:
        raise (coding or FailureCoding()).failure(exc) from exc
