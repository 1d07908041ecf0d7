"""Closed vocabularies: a user's spelling of a choice (a strategy, a sink, a delete rule...) made
a typed value once, where it enters.

Each vocabulary is one :class:`Vocabulary` (a ``StrEnum``) declared once in the layer that owns
the concept. The public entry points (the asset factories, the component, the job, the
resources' event iterators) call :meth:`Vocabulary.parse` on what the user wrote and pass the
member down; nothing below checks it again. A member compares equal to its spelling
(``Sink.MERGE == "merge"``), and parsing a member returns it unchanged.
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar, Self

from .errors import DponeError


class Vocabulary(StrEnum):
    """A closed set of spellings.

    A subclass names the option it spells, the code a refusal carries and, optionally, the
    error type of its layer::

        class Sink(Vocabulary, option="sink", refusal="copy_options_invalid", error=PlanError):
            REPLACE = "replace"
    """

    option: ClassVar[str]
    """The option's name as a user writes it (``sink``)."""
    refusal: ClassVar[str]
    """The stable code of an unknown spelling."""
    error: ClassVar[type[DponeError]]
    """The error type a refusal is raised as."""

    def __init_subclass__(
        cls,
        *,
        option: str = "",
        refusal: str = "",
        error: type[DponeError] = DponeError,
        **kwargs: object,
    ) -> None:
        super().__init_subclass__(**kwargs)
        cls.option, cls.refusal, cls.error = option, refusal, error

    @classmethod
    def parse(cls, value: object) -> Self:
        """The member spelled ``value`` (a member is returned as it is).

        Raises:
            DponeError: (the vocabulary's ``error`` type) its refusal code for any other value,
                listing the valid spellings.
        """
        if isinstance(value, cls):
            return value
        for member in cls:
            if value == member.value:
                return member
        names = ", ".join(member.value for member in cls)
        raise cls.error(
            cls.refusal,
            f"Unknown {cls.option} {value!r} (one of {names}).",
            [f"Use one of {names}."],
        )
