"""A job's options as one frozen, validated object, parsed once where it enters.

The companion of :class:`~.vocabulary.Vocabulary` for a whole job: each job (snapshot copy,
backfill, incremental stream, replication group, Kafka copy) keeps its configuration in one
subclass of :class:`ParsedOptions`, defined in the job's own package, which names the code of a
refusal and the error type of its layer (as a vocabulary does). The factory, the resource
method, the event iterator, the engine and the component's YAML model all take that object, so
an option is defined, validated and documented once, and adding one touches its definition and
the code that uses it, not the signatures in between (the shape of dagster-sling's
``replication_config`` and dagster-dlt's ``dlt_source``). It lives at the bottom of the package
so that an engine on any floor can take it; the engines above the core subclass
:class:`dpone_dagster.core.options.JobOptions`, whose refusals come from the one catalog.

A factory keeps Dagster's own arguments beside the object; its keyword shortcuts (the options a
user passes most) are built into the object by :func:`build_options`, which also accepts, for
one release, the keyword arguments the factories took before the object existed, with a
:class:`DeprecationWarning` that names them.

A field whose type is a :class:`~.vocabulary.Vocabulary` takes its spelling as text too, parsed
by the vocabulary (its own refusal's code and the spellings it lists). A field validator that
raises a :class:`~.errors.DponeError` (an existing parser such as ``BatchSize.parse``) keeps its
own code and message; any other invalid value (a wrong type, an unknown field) is the class's
:attr:`~ParsedOptions.refusal`.

Examples:
    >>> class Demo(ParsedOptions):
    ...     refusal: ClassVar[str] = "demo_options_invalid"
    ...     batch: int = 10
    >>> Demo(batch=5).batch
    5
    >>> try:
    ...     Demo.parse({"batch": "x"})
    ... except DponeError as exc:
    ...     print(exc.code)
    demo_options_invalid
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, ClassVar, Self, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from .errors import DponeError
from .vocabulary import Vocabulary

__all__ = ["ParsedOptions", "build_options"]


class ParsedOptions(BaseModel):
    """The base of a job's options: frozen, no unknown field, validated once.

    A subclass sets :attr:`refusal` (the code of an invalid option) and :attr:`error` (its
    layer's error type) and declares its fields with their defaults and docs. Build it with
    :meth:`parse` (or :func:`build_options` in a factory) to get that coded error instead of
    pydantic's ``ValidationError``; constructing it directly raises ``ValidationError``, as any
    pydantic model does.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    refusal: ClassVar[str] = "options_invalid"
    """The stable code of an invalid option."""
    error: ClassVar[type[DponeError]] = DponeError
    """The error type a refusal is raised as."""

    @classmethod
    def refused(cls, detail: str) -> DponeError:
        """The error of an invalid option (``detail``: which field, and why)."""
        return cls.error(cls.refusal, detail, ["Fix the option named in the message."])

    @classmethod
    def parse(cls, values: Mapping[str, Any]) -> Self:
        """The options from ``values`` (field name -> value), or the job's coded error.

        Raises:
            DponeError: :attr:`refusal` (as :attr:`error`), naming each invalid field and why;
                a field's own parser's error as it raised it.
        """
        try:
            return cls.model_validate(dict(values))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'options'}: {_reason(err)}"
                for err in exc.errors()
            )
            raise cls.refused(f"{cls.__name__}: {problems}.") from None

    @field_validator("*", mode="before")
    @classmethod
    def _vocabulary_field(cls, value: Any, info: ValidationInfo) -> Any:
        """A vocabulary's field, parsed by its vocabulary (a member passes unchanged)."""
        kind = cls.model_fields[str(info.field_name)].annotation
        return (
            kind.parse(value) if isinstance(kind, type) and issubclass(kind, Vocabulary) else value
        )

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied, validated like the original."""
        return self.parse({**self.fields(), **changes})

    def fields(self) -> dict[str, Any]:
        """The field values as given (nested objects kept, not dumped)."""
        return {name: getattr(self, name) for name in type(self).model_fields}


_T = TypeVar("_T", bound=ParsedOptions)


def _reason(err: Any) -> str:
    """pydantic's message for one error, with the engine's own message for a coded refusal."""
    ctx = err.get("ctx") or {}
    inner = ctx.get("error")
    return str(inner) if inner is not None else str(err["msg"])


def build_options(
    cls: type[_T],
    options: _T | None,
    *,
    caller: str,
    shortcuts: Mapping[str, Any] | None = None,
    legacy: Mapping[str, Any] | None = None,
    argument: str = "options",
    stacklevel: int = 3,
) -> _T:
    """The options a factory or resource method runs with.

    Args:
        cls: The job's options class.
        options: The object the caller passed (``None``: the defaults).
        caller: The public name called (``incremental_asset``), for the messages.
        shortcuts: The caller's keyword shortcuts that were given (``None`` values left out):
            they override the object's fields of the same names.
        legacy: Keyword arguments the caller took before the options object (its ``**kwargs``):
            accepted for one release with a ``DeprecationWarning``; a name that is not a field
            of ``cls`` is a ``TypeError``, as for any unknown keyword argument.
        argument: The caller's argument that takes the object (``options``, ``read``), for
            the messages.
        stacklevel: The warning's stack level (3: the caller of the function that calls this).

    Raises:
        TypeError: for an unknown keyword argument.
        DponeError: ``cls.refusal`` for an invalid value.
    """
    legacy = dict(legacy or {})
    unknown = sorted(set(legacy) - set(cls.model_fields))
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
    if legacy:
        names = ", ".join(sorted(legacy))
        warnings.warn(
            f"{caller}(..., {names}=...) is deprecated and will be removed in the next release: "
            f"pass {argument}={cls.__name__}({names}=...) instead.",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
    given = {**legacy, **{k: v for k, v in (shortcuts or {}).items() if v is not None}}
    if options is None:
        return cls.parse(given)
    if not isinstance(options, cls):
        raise TypeError(f"{caller}({argument}=...) takes a {cls.__name__}, not {type(options)!r}")
    return options.replace(**given) if given else options
