"""A job's options in the engines' floors: :class:`JobOptions`, refused with a catalogued code.

The shape (one frozen object, validated once, the factories' old keywords accepted for one
release) is :mod:`dpone_dagster.lifecycle.options`'s, at the bottom of the package so that the
snapshot copy's engine (:mod:`dpone_dagster.postgres`) can take its options too. An engine
above the core subclasses :class:`JobOptions`: an invalid option is an
:class:`~dpone_dagster.core.errors.EngineError` with its job's code from the one catalog
(:data:`~dpone_dagster.core.errors.ENGINE_ERRORS`). :func:`build_options` is the factories' one
way to build them.

Examples:
    >>> class Demo(JobOptions):
    ...     refusal: ClassVar[str] = "incremental_options_invalid"
    ...     batch: int = 10
    >>> Demo(batch=5).batch
    5
    >>> try:
    ...     Demo.parse({"batch": "x"})
    ... except EngineError as exc:
    ...     print(exc.code)
    incremental_options_invalid
"""

from __future__ import annotations

from typing import ClassVar

from dpone_dagster.core.errors import EngineError, engine_error
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.lifecycle.options import ParsedOptions, build_options

__all__ = ["JobOptions", "build_options"]


class JobOptions(ParsedOptions):
    """The base of an engine's options: :class:`~dpone_dagster.lifecycle.options.ParsedOptions`
    whose :attr:`refusal` is a key of ``ENGINE_ERRORS``, raised as an ``EngineError``."""

    refusal: ClassVar[str] = "incremental_options_invalid"
    """The error code of an invalid option (a key of ``ENGINE_ERRORS``)."""
    error: ClassVar[type[DponeError]] = EngineError

    @classmethod
    def refused(cls, detail: str) -> DponeError:
        """The catalogued error of an invalid option (``detail``: which field, and why)."""
        return engine_error(cls.refusal, detail)
