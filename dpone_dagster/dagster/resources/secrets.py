"""Keeping the resources' secrets (a DSN's password, a MySQL password, an API token) secret.

Two leaks are closed here, once for every dpone resource (:class:`SecretResource` is their
base):

- pydantic's ``ValidationError`` quotes the rejected value (``input_value=...``): every dpone
  resource sets ``hide_input_in_errors``, so a DSN refused at definition time is never echoed;
  dpone's own messages name the field and the server, never the password.
- Dagster stores a resource's literal configuration in its run storage (the job snapshot in
  ``runs.db``, shown in the UI's launchpad), while an ``EnvVar`` is stored as the variable's
  name. A secret given as a literal string therefore warns when the resource is defined
  (:class:`LiteralSecretWarning`), naming the ways out: ``dg.EnvVar``, a passfile and
  ``PGPASSWORD``.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import dagster as dg
from pydantic import ConfigDict

_AT_RUN_TIME: ContextVar[bool] = ContextVar("dpone_resource_at_run_time", default=False)


class LiteralSecretWarning(UserWarning):
    """A resource was given a secret as a literal string, which Dagster stores in its run
    storage; pass it through ``dg.EnvVar`` (or a passfile, or ``PGPASSWORD``)."""


POSTGRES_WAYS_OUT = (
    "pass the DSN with dg.EnvVar (e.g. dsn=dg.EnvVar('DPONE_SOURCE_DSN'), or "
    "'{{ env.DPONE_SOURCE_DSN }}' in YAML), or leave the password out of the DSN and let libpq "
    "read it from a passfile (~/.pgpass, or passfile=/path in the DSN) or from PGPASSWORD in "
    "the run's environment"
)
"""How to keep a DSN's password out of Dagster's storage: the advice of the PostgreSQL
resources' warning."""


def warn_if_literal(
    owner: str, field: str, value: Any, *, holds_secret: bool, ways_out: str = POSTGRES_WAYS_OUT
) -> None:
    """Warns (:class:`LiteralSecretWarning`) when ``value`` is a literal holding a secret.

    Silent for an ``EnvVar`` (Dagster stores its name, resolves it when a run starts) and when
    Dagster itself rebuilds the resource at run time from an ``EnvVar``'s resolved value.

    Args:
        owner: The resource class, for the message.
        field: The field that holds the secret.
        value: The value given to the field.
        holds_secret: Whether the literal holds a secret (a DSN with a password, a password).
        ways_out: How to pass it instead (a DSN's: ``dg.EnvVar``, a passfile, ``PGPASSWORD``).
    """
    if isinstance(value, dg.EnvVar) or _AT_RUN_TIME.get() or not holds_secret:
        return
    warnings.warn(
        f"{owner}: `{field}` holds a literal secret. Dagster stores a resource's literal "
        "configuration in its run storage (the job snapshot in runs.db, shown in the UI), so "
        f"anyone who can read that storage reads the secret. Instead, {ways_out}.",
        LiteralSecretWarning,
        stacklevel=user_level(),
    )


_FRAMEWORKS = frozenset({"dpone_dagster", "dagster", "pydantic", "pydantic_core"})


def at_run_time() -> bool:
    """Whether Dagster is rebuilding the resource for a run, with its ``EnvVar`` resolved."""
    return _AT_RUN_TIME.get()


def user_level() -> int:
    """The ``stacklevel`` of the first caller outside dpone, Dagster and pydantic: the warning
    then names the user's line that defined the resource (``definitions.py:12``)."""
    frame, level = sys._getframe(1), 1  # the frame that calls warnings.warn is level 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").split(".")[0] in (
        _FRAMEWORKS
    ):
        frame, level = frame.f_back, level + 1
    return level


@contextmanager
def _at_run_time() -> Iterator[None]:
    token = _AT_RUN_TIME.set(True)
    try:
        yield
    finally:
        _AT_RUN_TIME.reset(token)


class SecretResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """The base of every dpone resource: validation errors never quote the input, and a
    literal secret warns when the resource is defined (see the module)."""

    model_config = ConfigDict(hide_input_in_errors=True)

    def _with_updated_values(self, values: Mapping[str, Any] | None) -> Any:
        # Dagster rebuilds the resource when a step starts, with every EnvVar resolved to its
        # value: that is not a literal secret the user wrote, so it does not warn again.
        with _at_run_time():
            return super()._with_updated_values(values)
