"""What every set of ``dpone/`` keys shares: :class:`DponeSet` (the namespace, strict types,
values rounded to what a person reads, a set's keys read back), and how a value reads
(:func:`readable_number`, :func:`bullets`).
"""

from collections.abc import Mapping, Sequence
from typing import Any, Self

# No public name in dagster 1.13 (dagster.NamespacedMetadataSet is absent): this is the
# module Dagster's own TableMetadataSet and its integrations' sets come from.
from dagster._core.definitions.metadata import NamespacedMetadataSet
from pydantic import ConfigDict, model_validator

NAMESPACE = "dpone"
"""The namespace of every key of dpone's own."""


def readable_number(name: str, value: Any) -> Any:
    """``value`` of the field ``name`` rounded to what it means: seconds (``lag_seconds``,
    ``seconds_load``) to the millisecond, a rate (``rows_per_second``) to a whole number; any
    other value as it is.

    Examples:
        >>> readable_number("extraction_seconds", 0.01573760400003721)
        0.016
        >>> readable_number("rows_per_second", 61879.27353732867)
        61879
    """
    if not isinstance(value, float):
        return value
    if name.endswith("_per_second"):
        return round(value)
    if name.startswith("seconds_") or name.endswith("_seconds"):
        return round(value, 3)
    return value


def bullets(items: Sequence[str]) -> str:
    """``items`` as a Markdown list, one a line (``dpone/next_actions``, in metadata and
    descriptions).

    Examples:
        >>> print(bullets(["Run again.", "Or resync."]))
        - Run again.
        - Or resync.
    """
    return "\n".join(f"- {item}" for item in items)


class DponeSet(NamespacedMetadataSet):
    """A set of ``dpone/`` keys, one field per key, typed as its value is (each unset field is
    left out): the base of every job's set (:mod:`dpone_dagster.dagster.metadata.keys`).

    A value of another type than the declared one (a bool where a count is declared, a number
    where text is) fails where the metadata is built instead of changing its type.
    """

    model_config = ConfigDict(strict=True, use_attribute_docstrings=True)

    @model_validator(mode="before")
    @classmethod
    def _readable(cls, values: Any) -> Any:
        """What a person reads: an empty text is left out rather than shown as ``""``, seconds
        are rounded to the millisecond and a rate to a whole number (:func:`readable_number`)."""
        if not isinstance(values, dict):
            return values
        return {
            name: readable_number(name, value)
            for name, value in values.items()
            if value is not None and value != ""
        }

    @classmethod
    def namespace(cls) -> str:
        """``dpone``."""
        return NAMESPACE

    @classmethod
    def key(cls, field: str) -> str:
        """The ``dpone/`` key of the set's field ``field``.

        Raises:
            KeyError: for a field the set does not declare.
        """
        if field not in cls.model_fields:
            raise KeyError(f"{cls.__name__} declares no key {field!r}")
        return f"{NAMESPACE}/{field}"

    @classmethod
    def read(cls, metadata: Mapping[str, Any], *fields: str) -> Self:
        """The set's ``fields`` of ``metadata`` (a spec's, a recorded materialization's), as
        their values (a recorded ``TextMetadataValue`` is read as its text); other keys are left
        alone, so a key an older version wrote with another type does not matter here.

        Raises:
            KeyError: for a field the set does not declare.
        """
        wanted = {cls.key(f) for f in fields}
        return cls.extract({k: v for k, v in metadata.items() if k in wanted})
