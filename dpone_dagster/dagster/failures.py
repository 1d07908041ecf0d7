"""Run-time errors as Dagster failures that carry the stable code and the next actions."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import dagster as dg

from dpone_dagster.dagster.metadata.keys.base import bullets
from dpone_dagster.dagster.metadata.keys.common import CommonMetadataSet, FailureMetadataSet
from dpone_dagster.lifecycle import DponeError

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


@contextmanager
def dagster_failures() -> Iterator[None]:
    """Re-raises any :class:`DponeError` inside the block as a :class:`DponeFailure`."""
    try:
        yield
    except DponeError as exc:
        raise DponeFailure(exc) from exc
