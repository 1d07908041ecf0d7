"""``RestRead``: what a REST copy reads, one frozen object validated once.

:func:`~dpone_dagster.rest_copy_asset`, :meth:`~dpone_dagster.RestSourceResource.copy_table`
and the adapter (:class:`~.rest.RestSource`) all take this object: an API resource's path, the
pydantic model of one record (its fields are the columns, mapped here, so an unmappable field
fails when the object is built), where the records sit in a body, how pages follow and how
many may. How the rows land is the copy's :class:`~.copy_options.SourceCopyOptions`; how to
reach the API is the adapter's :class:`~.rest.RestSettings`.

Examples:
    >>> from pydantic import BaseModel
    >>> class Item(BaseModel):
    ...     id: int
    >>> RestRead(path="/items", model=Item, records_path="data").records_path
    'data'
    >>> try:
    ...     RestRead.parse({"path": "/items", "model": Item, "max_pages": 0})
    ... except SourceError as exc:
    ...     print(exc.code)
    rest_source_invalid
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Self

from pydantic import BaseModel, field_validator, model_validator

from dpone_dagster.lifecycle import DponeError
from dpone_dagster.lifecycle.options import ParsedOptions

from .protocol import SourceError
from .rest_pagination import Pagination
from .rest_schema import model_columns

__all__ = ["RestRead"]


class RestRead(ParsedOptions):
    """What a REST copy reads: one API resource, every record validated by :attr:`model`.

    Raises:
        SourceError: ``rest_source_invalid`` for an empty path or id field, ``max_pages``
            below 1, a pagination without ``next_request``, a field of another type or an
            unknown field (through :meth:`parse`; constructing it directly raises pydantic's
            ``ValidationError`` for the last three); ``rest_type_unmappable`` for a model
            field no column type fits.
    """

    refusal: ClassVar[str] = "rest_source_invalid"
    error: ClassVar[type[DponeError]] = SourceError

    path: str
    """The resource's path under the base URL (``/items``)."""
    model: type[BaseModel]
    """The pydantic model every record must satisfy; its fields are the columns."""
    records_path: str | None = None
    """Dotted path of the record list in each body (``data``); None when the body is it."""
    pagination: Pagination | None = None
    """``PageNumberPagination``, ``CursorPagination``, ``NextLinkPagination`` (any
    :class:`~.rest_pagination.Pagination`) or None for one page."""
    params: Mapping[str, object] = {}
    """Query parameters of every request (sent as text)."""
    id_field: str = "id"
    """The record key that names a record in a validation error."""
    max_pages: int | None = None
    """Stop with ``rest_too_many_pages`` past this many pages (a runaway API); None: no limit."""

    @classmethod
    def refused(cls, detail: str) -> DponeError:
        """The REST source's error of an invalid read (``detail``: which field, and why)."""
        return SourceError(cls.refusal, detail, ["Fix the field named in the message."])

    @field_validator("path", "id_field", mode="after")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if not value.strip():
            raise cls.refused("path and id_field are not empty.")
        return value

    @field_validator("max_pages", mode="after")
    @classmethod
    def _max_pages(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise cls.refused(f"max_pages={value}: a read takes at least one page.")
        return value

    @model_validator(mode="after")
    def _model_maps(self) -> Self:
        model_columns(self.model)  # refuses a field no column type fits: rest_type_unmappable
        return self
