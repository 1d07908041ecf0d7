"""The error type every layer raises on purpose: a stable code, a message, next actions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Self


class DponeError(Exception):
    """An error with a stable machine-readable code and the next actions for a human.

    Every error that dpone raises deliberately is a ``DponeError`` (or a subclass), so callers
    can branch on :attr:`code` without parsing messages, and the Dagster layer can surface the
    code and next actions as run-failure metadata.

    Args:
        code: A stable ``snake_case`` identifier such as ``backfill_checkpoint_stale``.
        message: What went wrong, in one or two sentences. Never contains a password.
        next_actions: What the operator can do about it, most useful first.
    """

    def __init__(self, code: str, message: str, next_actions: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.next_actions: tuple[str, ...] = tuple(next_actions)

    @classmethod
    def from_catalog(
        cls,
        catalog: Mapping[str, tuple[str, tuple[str, ...]]],
        code: str,
        detail: str | None = None,
        next_actions: Sequence[str] | None = None,
    ) -> Self:
        """The error for ``code`` from a catalog of ``code -> (message, next actions)``.

        Args:
            catalog: The layer's codes with their default message and next actions.
            code: A key of ``catalog``.
            detail: A sentence appended to the message (what exactly was found).
            next_actions: Replaces the catalogued next actions when given.

        Raises:
            KeyError: for a code that is not catalogued (a programming error).
        """
        message, actions = catalog[code]
        if detail:
            message = f"{message} {detail}"
        return cls(code, message, tuple(next_actions) if next_actions else actions)

    def __str__(self) -> str:
        text = f"[{self.code}] {self.message}"
        if self.next_actions:
            text += " Next: " + " ".join(self.next_actions)
        return text

    def to_dict(self) -> dict[str, Any]:
        """Returns the error as a JSON-ready mapping (code, message, next_actions)."""
        return {"code": self.code, "message": self.message, "next_actions": list(self.next_actions)}


class LifecycleError(DponeError):
    """A lifecycle rule was broken: a receipt out of order or an artifact misused."""
