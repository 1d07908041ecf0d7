"""Pagination of an HTTP JSON API: page numbers, cursors and next links."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import httpx


@dataclass(frozen=True)
class PageRequest:
    """One page's request: a URL (relative to the base URL, or absolute) and query params."""

    url: str
    params: tuple[tuple[str, str], ...] = ()

    def with_param(self, name: str, value: object) -> PageRequest:
        """The same request with query parameter ``name`` set to ``value``."""
        kept = tuple((k, v) for k, v in self.params if k != name)
        return PageRequest(self.url, (*kept, (name, str(value))))


def lookup(body: Any, path: str | None) -> Any:
    """The value at a dotted ``path`` in a JSON body (the body itself for None or '')."""
    value = body
    for part in (path or "").split("."):
        if not part:
            continue
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


@runtime_checkable
class Pagination(Protocol):
    """How the next page's request follows from the current page."""

    def next_request(
        self, current: PageRequest, body: Any, records: list[Any], response: httpx.Response
    ) -> PageRequest | None:
        """The next page's request, or None after the last page."""


@dataclass(frozen=True)
class PageNumberPagination:
    """``?page=1``, ``?page=2``... until a page has no records.

    Attributes:
        page_param: The query parameter holding the page number.
        first_page: The first page's number.
        size_param: The query parameter holding the page size, if the API takes one.
        page_size: The page size to ask for.
    """

    page_param: str = "page"
    first_page: int = 1
    size_param: str | None = None
    page_size: int | None = None

    def first(self, request: PageRequest) -> PageRequest:
        """The first page's request."""
        request = request.with_param(self.page_param, self.first_page)
        if self.size_param is not None and self.page_size is not None:
            request = request.with_param(self.size_param, self.page_size)
        return request

    def next_request(
        self, current: PageRequest, body: Any, records: list[Any], response: httpx.Response
    ) -> PageRequest | None:
        """The following page number, until an empty page."""
        if not records:
            return None
        page = int(dict(current.params)[self.page_param])
        return current.with_param(self.page_param, page + 1)


@dataclass(frozen=True)
class CursorPagination:
    """An opaque cursor from the body sent back as a query parameter, until it is empty.

    Attributes:
        cursor_param: The query parameter that carries the cursor.
        next_cursor_path: Dotted path of the next cursor in the body (``meta.next_cursor``).
    """

    cursor_param: str = "cursor"
    next_cursor_path: str = "next_cursor"

    def next_request(
        self, current: PageRequest, body: Any, records: list[Any], response: httpx.Response
    ) -> PageRequest | None:
        """The request carrying the next cursor, or None when there is none."""
        cursor = lookup(body, self.next_cursor_path)
        if cursor in (None, ""):
            return None
        return current.with_param(self.cursor_param, cursor)


@dataclass(frozen=True)
class NextLinkPagination:
    """A link to the next page, from the body or from the ``Link: <...>; rel="next"`` header.

    Attributes:
        next_path: Dotted path of the next page's URL in the body; None reads the Link header.
    """

    next_path: str | None = "next"

    def next_request(
        self, current: PageRequest, body: Any, records: list[Any], response: httpx.Response
    ) -> PageRequest | None:
        """The next page's absolute URL (relative links are resolved), or None."""
        if self.next_path is None:
            link = response.links.get("next", {}).get("url")
        else:
            link = lookup(body, self.next_path)
        if not link:
            return None
        return PageRequest(str(response.url.join(str(link))))
