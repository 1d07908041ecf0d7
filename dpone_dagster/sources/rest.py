"""The REST source: an HTTP JSON API read page by page, every record validated by a model.

Each page is fetched with timeouts and bounded retries (exponential backoff on 429, 5xx and
transport errors, honouring ``Retry-After``), then every record of the page is validated by the
user's pydantic model before any of them is handed to staging. A record that fails validation
stops the load with ``rest_record_invalid`` naming the page, the record's index and its id.

The receipt makes no snapshot claim (an HTTP API has none): the window is dated by the
orchestrator's clock, opens right before the first request and completes after the last page.
Byte evidence is the size of every response body read.
"""

from __future__ import annotations

import email.utils
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import tenacity
from pydantic import BaseModel, ValidationError

from dpone_dagster.lifecycle import ExtractResult
from dpone_dagster.lifecycle.options import build_options

from .protocol import ByteMeter, Row, RowStreamArtifact, SourceColumn, SourceError, extract_stream
from .rest_pagination import PageNumberPagination, PageRequest, lookup
from .rest_read import RestRead
from .rest_schema import model_columns, row_builder


@dataclass(frozen=True)
class RestSettings:
    """How to reach an HTTP JSON API.

    Attributes:
        base_url: The API's root (``https://api.example.com/v1``).
        headers: Headers sent with every request (an ``Authorization`` token: never printed).
        timeout: Seconds for each connect, read, write and pool wait.
        max_retries: Retries after the first attempt of a request (0 disables retrying).
        backoff_seconds: The first retry's wait; each next one doubles it.
        max_backoff_seconds: The longest wait between two attempts (also caps ``Retry-After``).
    """

    base_url: str
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    timeout: float = 30.0
    max_retries: int = 5
    backoff_seconds: float = 0.5
    max_backoff_seconds: float = 30.0


class HttpSession:
    """The live HTTP client of a REST read. Implements :class:`~dpone_dagster.lifecycle.LiveSource`.

    An HTTP read has no transaction: every outcome closes the client.
    """

    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    @property
    def closed(self) -> bool:
        """True once the client is closed."""
        return self.client.is_closed

    def commit_and_close(self) -> None:
        """Closes the client (nothing to commit)."""
        self.client.close()

    def rollback_and_close(self) -> None:
        """Closes the client (nothing to roll back)."""
        self.client.close()


class _RetryableStatusError(Exception):
    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds the server asked to wait (``Retry-After``: seconds or an HTTP date), or None."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


class _Backoff(tenacity.wait.wait_base):
    """Exponential backoff, or the server's ``Retry-After`` when it gave one; both capped."""

    def __init__(self, settings: RestSettings) -> None:
        self.base = settings.backoff_seconds
        self.cap = settings.max_backoff_seconds

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        error = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(error, _RetryableStatusError):
            asked = _retry_after(error.response)
            if asked is not None:
                return min(self.cap, asked)
        return float(min(self.cap, self.base * 2 ** (retry_state.attempt_number - 1)))


def _display(url: httpx.URL) -> str:
    """A URL for messages: no query string (it may hold an API key)."""
    return str(url.copy_with(query=None))


def fetch(client: httpx.Client, request: PageRequest, settings: RestSettings) -> httpx.Response:
    """GETs one page with bounded retries.

    Raises:
        SourceError: ``rest_http_error`` for a status that retrying cannot fix (4xx other than
            429), ``rest_request_failed`` once the retries are spent.
    """
    url = client.build_request("GET", request.url).url
    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(settings.max_retries + 1),
        wait=_Backoff(settings),
        retry=tenacity.retry_if_exception_type((_RetryableStatusError, httpx.TransportError)),
        reraise=True,
    )
    try:
        for attempt in retrying:
            with attempt:
                response = client.get(request.url, params=list(request.params))
                if response.status_code == 429 or response.status_code >= 500:
                    raise _RetryableStatusError(response)
                if response.status_code >= 400:
                    raise SourceError(
                        "rest_http_error",
                        f"GET {_display(url)} answered HTTP {response.status_code}.",
                        ["Check the URL, the parameters and the credentials."],
                    )
                return response
    except (_RetryableStatusError, httpx.TransportError) as exc:
        raise SourceError(
            "rest_request_failed",
            f"GET {_display(url)} failed after {settings.max_retries + 1} attempt(s): "
            f"{type(exc).__name__}: {exc}",
            ["Check that the API is up; raise max_retries or timeout for a slow API."],
        ) from None
    raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover


def _invalid(page: int, index: int, record: Any, id_field: str, error: ValidationError) -> str:
    ident = record.get(id_field) if isinstance(record, Mapping) else None
    which = f"record {index}" + (f" ({id_field}={ident!r})" if ident is not None else "")
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '<record>'}: {e['msg']}"
        for e in error.errors(include_input=False)[:3]
    )
    return f"Page {page}, {which} does not match {error.title}: {problems}"


class RestSource:
    """An HTTP JSON API as a generic source: one row per record, columns from a model.

    Args:
        settings: How to reach the API.
        read: What is read (:class:`~.rest_read.RestRead`: the path, the model every record
            must satisfy, where the records are, pagination, parameters, id field, page limit).
        model: Deprecated: with the path as ``read`` (``RestSource(settings, "/items", Item)``),
            for one release.
        **legacy: ``path``, ``records_path``, ``pagination``, ``params``, ``id_field`` and
            ``max_pages`` as keywords: deprecated (``read=RestRead(...)``), for one release.

    Raises:
        SourceError: ``rest_source_invalid`` for a bad read given as keywords,
            ``rest_type_unmappable`` for a model field no column type fits.

    Examples:
        >>> class Item(BaseModel):
        ...     id: int
        >>> read = RestRead(path="/items", model=Item)
        >>> RestSource(RestSettings("https://api.example.com/v1"), read).label
        'https://api.example.com/v1/items'
    """

    def __init__(
        self,
        settings: RestSettings,
        read: RestRead | str | None = None,
        model: type[BaseModel] | None = None,
        **legacy: Any,
    ) -> None:
        if isinstance(read, str):  # the path and model given positionally, before RestRead
            legacy = {"path": read, **({} if model is None else {"model": model}), **legacy}
        elif model is not None:
            legacy = {"model": model, **legacy}
        read = build_options(
            RestRead, None if isinstance(read, str) else read, caller="RestSource",
            legacy=legacy, argument="read",
        )  # fmt: skip
        self.settings = settings
        self.read = read
        self.path = read.path
        self.model = read.model
        self.records_path = read.records_path
        self.pagination = read.pagination
        self.params = tuple((k, str(v)) for k, v in read.params.items())
        self.id_field = read.id_field
        self.max_pages = read.max_pages
        self._columns = model_columns(read.model)

    @property
    def label(self) -> str:
        """The resource's URL, for messages and metadata."""
        return self.settings.base_url.rstrip("/") + "/" + self.path.lstrip("/")

    def describe(self) -> list[SourceColumn]:
        """The model's fields as columns (mapped when the source was built)."""
        return list(self._columns)

    def _records(self, body: Any, page: int) -> list[Any]:
        records = lookup(body, self.records_path)
        if not isinstance(records, list):
            where = f"at {self.records_path!r}" if self.records_path else "as the body"
            raise SourceError(
                "rest_response_invalid",
                f"Page {page} of {self.label} has no record list {where}.",
                ["Set records_path to the list's dotted path (e.g. 'data' or 'result.items')."],
            )
        return records

    def _validated(self, records: list[Any], page: int) -> list[BaseModel]:
        validated = []
        for index, record in enumerate(records):
            try:
                validated.append(self.model.model_validate(record))
            except ValidationError as exc:
                raise SourceError(
                    "rest_record_invalid",
                    f"{_invalid(page, index, record, self.id_field, exc)} ({self.label}); "
                    "the load was aborted.",
                    ["Fix the record at the source, or loosen the model (a field | None)."],
                ) from None
        return validated

    def _pages(self, client: httpx.Client, meter: ByteMeter) -> Iterator[Row]:
        build = row_builder(self.model)
        request: PageRequest | None = PageRequest(self.path, self.params)
        if isinstance(self.pagination, PageNumberPagination):
            request = self.pagination.first(PageRequest(self.path, self.params))
        seen: set[PageRequest] = set()
        page = 0
        while request is not None:
            page += 1
            if self.max_pages is not None and page > self.max_pages:
                raise SourceError(
                    "rest_too_many_pages",
                    f"{self.label} still had pages after {self.max_pages}.",
                    ["Raise max_pages, or check the API's pagination settings."],
                )
            seen.add(request)
            response = fetch(client, request, self.settings)
            meter.add(len(response.content))
            try:
                body = response.json()
            except ValueError:
                raise SourceError(
                    "rest_response_invalid",
                    f"Page {page} of {self.label} is not JSON.",
                    ["Check the path; the API must answer application/json."],
                ) from None
            records = self._records(body, page)
            for record in self._validated(records, page):
                yield build(record)
            if self.pagination is None:
                return
            request = self.pagination.next_request(request, body, records, response)
            if request in seen:
                raise SourceError(
                    "rest_pagination_loop",
                    f"Page {page} of {self.label} points back to a page already read.",
                    ["Check the pagination settings (cursor or next-link path)."],
                )

    def extract(self) -> ExtractResult[RowStreamArtifact]:
        """A pending stream of the resource's records; nothing is requested until it is read."""
        settings = self.settings

        def opener(artifact: RowStreamArtifact, meter: ByteMeter) -> Iterator[Row]:
            client = httpx.Client(
                base_url=settings.base_url,
                headers=dict(settings.headers),
                timeout=httpx.Timeout(settings.timeout),
                follow_redirects=True,
            )
            artifact.attach_source(HttpSession(client))
            yield from self._pages(client, meter)

        return extract_stream(self._columns, opener, source_label=self.label)
