"""The REST adapter against a real HTTP server started per test, and a real PostgreSQL target."""

from __future__ import annotations

import enum
from collections.abc import Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import psycopg
import pytest
from pydantic import BaseModel

from dpone_dagster.lifecycle import ORCHESTRATOR_UTC, ReceiptState, TerminalOutcome
from dpone_dagster.postgres import TableName
from dpone_dagster.sources import (
    CursorPagination,
    NextLinkPagination,
    PageNumberPagination,
    RestRead,
    RestSettings,
    RestSource,
    SourceError,
    stage_rows,
)
from tests.helpers.http_api import DROP, HANG, ApiServer, Reply, Request
from tests.helpers.pg import staging_tables
from tests.helpers.staged import stage_and_read


class Size(enum.Enum):
    SMALL = "small"
    LARGE = "large"


class Item(BaseModel):
    id: int
    name: str
    price: Decimal
    size: Size
    active: bool
    born: date
    seen_at: datetime
    ref: UUID | None = None
    tags: list[str] = []
    extra: dict[str, Any] | None = None


def item(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "name": f"item 'n°{i}'\t\\",
        "price": f"{i}.10",
        "size": "small" if i % 2 else "large",
        "active": i % 2 == 0,
        "born": "2020-02-29",
        "seen_at": f"2024-01-0{i}T10:00:00+02:00",
        "ref": None if i == 1 else f"00000000-0000-0000-0000-00000000000{i}",
        "tags": ["a", str(i)],
        "extra": {"nested": {"i": i}} if i % 2 else None,
    }


PAGES = [[item(1), item(2)], [item(3), item(4)], [item(5)]]
ITEMS = TableName("public", "items")


def settings(server: ApiServer, **changes: Any) -> RestSettings:
    base = {"timeout": 2.0, "max_retries": 2, "backoff_seconds": 0.02, "max_backoff_seconds": 2.0}
    return RestSettings(server.url, headers={"Authorization": "Bearer s3cret"}, **base | changes)


def page_numbers(request: Request) -> Reply:
    page = int(request.query["page"])
    return Reply({"data": PAGES[page - 1] if page <= len(PAGES) else []})


def stage_failing(respond: Any, dsn: str) -> tuple[ApiServer, Any, Any, Any]:
    """Stages a paged source from a server expected to fail; settles it ``abort``."""
    with ApiServer(respond) as server:
        source = RestSource(
            settings(server),
            RestRead(
                path="/items", model=Item, records_path="data", pagination=PageNumberPagination()
            ),
        )
        result = source.extract()
        with psycopg.connect(dsn) as conn, pytest.raises(SourceError) as caught:
            stage_rows(conn, ITEMS, result.artifact, dsn=dsn)
    return server, result, caught, result.artifact.abort()


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer(page_numbers) as server:
        yield server


def test_pages_are_validated_typed_and_staged(api: ApiServer, target_dsn: str) -> None:
    source = RestSource(
        settings(api),
        RestRead(path="/items", model=Item, records_path="data", pagination=PageNumberPagination()),
    )
    result, _, rows, types = stage_and_read(source, target_dsn, ITEMS)
    assert types == {
        "id": "bigint", "name": "text", "price": "numeric", "size": "text", "active": "boolean",
        "born": "date", "seen_at": "timestamp with time zone", "ref": "uuid", "tags": "jsonb",
        "extra": "jsonb",
    }  # fmt: skip
    assert [r[0] for r in rows] == [1, 2, 3, 4, 5]
    first, second = rows[0], rows[1]
    assert first[1:6] == ("item 'n°1'\t\\", Decimal("1.10"), "small", False, date(2020, 2, 29))
    assert first[6] == datetime(2024, 1, 1, 8, 0, tzinfo=UTC)
    assert first[7] is None and first[8] == ["a", "1"] and first[9] == {"nested": {"i": 1}}
    assert second[7] == UUID(int=2) and second[9] is None
    assert [r.query["page"] for r in api.requests] == ["1", "2", "3", "4"]
    assert all(r.headers["Authorization"] == "Bearer s3cret" for r in api.requests)
    receipt = result.extraction_receipt
    assert receipt.state is ReceiptState.COMPLETED and receipt.row_count == 5
    assert receipt.byte_count == sum(len(body) for _, body in api.bodies)
    assert receipt.clock_authority == ORCHESTRATOR_UTC
    assert receipt.snapshot_authority is None and receipt.source_token is None


def _cursor_reply(request: Request) -> Reply:
    page = int(request.query.get("cursor", "0"))
    more = page + 1 < len(PAGES)
    return Reply({"items": PAGES[page], "meta": {"next": str(page + 1) if more else None}})


def _link_body_reply(request: Request) -> Reply:
    page = int(request.path.rsplit("/", 1)[-1])
    more = page + 1 < len(PAGES)
    return Reply({"items": PAGES[page], "next": f"/pages/{page + 1}" if more else None})


def _link_header_reply(request: Request) -> Reply:
    page = int(request.path.rsplit("/", 1)[-1])
    more = page + 1 < len(PAGES)
    headers = {"Link": f'</pages/{page + 1}>; rel="next"'} if more else {}
    return Reply({"items": PAGES[page]}, headers=headers)


@pytest.mark.parametrize(
    ("respond", "path", "pagination"),
    [
        (_cursor_reply, "/items", CursorPagination("cursor", "meta.next")),
        (_link_body_reply, "/pages/0", NextLinkPagination("next")),
        (_link_header_reply, "/pages/0", NextLinkPagination(None)),
    ],
    ids=["cursor", "next-link-in-body", "link-header"],
)
def test_cursor_and_next_link_pagination(
    respond: Any, path: str, pagination: Any, target_dsn: str
) -> None:
    with ApiServer(respond) as server:
        source = RestSource(
            settings(server),
            RestRead(path=path, model=Item, records_path="items", pagination=pagination),
        )
        result, _, rows, _ = stage_and_read(source, target_dsn, ITEMS)
    assert [r[0] for r in rows] == [1, 2, 3, 4, 5]
    assert len(server.requests) == 3
    assert result.extraction_receipt.row_count == 5


def test_retries_back_off_and_honour_retry_after(target_dsn: str) -> None:
    script = iter([Reply({}, status=503), Reply({}, status=429, headers={"Retry-After": "1"})])

    def respond(request: Request) -> Reply:
        return next(script, None) or Reply([item(1)])

    with ApiServer(respond) as server:
        source = RestSource(
            settings(server, backoff_seconds=0.05), RestRead(path="/items", model=Item)
        )
        _, _, rows, _ = stage_and_read(source, target_dsn, ITEMS)
    assert [r[0] for r in rows] == [1]
    first, second, third = (r.at for r in server.requests)
    assert 0.04 <= second - first < 0.9  # exponential backoff: 0.05 s
    assert third - second >= 0.95  # the server asked for 1 s


def test_retries_are_bounded_and_client_errors_are_not_retried() -> None:
    with ApiServer(lambda r: Reply({}, status=500 if r.path == "/down" else 404)) as server:
        down = RestSource(
            settings(server, max_retries=2), RestRead(path="/down", model=Item)
        ).extract()
        with pytest.raises(SourceError) as failed:
            list(down.artifact.rows())
        assert failed.value.code == "rest_request_failed" and "3 attempt" in failed.value.message
        assert len(server.requests) == 3
        missing = RestSource(
            settings(server), RestRead(path="/missing?token=abc", model=Item)
        ).extract()
        with pytest.raises(SourceError) as refused:
            list(missing.artifact.rows())
        assert refused.value.code == "rest_http_error" and "HTTP 404" in refused.value.message
        assert "abc" not in refused.value.message  # query strings may hold keys
        assert len(server.requests) == 4
    for result in (down, missing):
        assert result.artifact.abort().sources_closed


def test_a_timeout_is_retried_then_fails() -> None:
    with ApiServer(lambda r: HANG) as server:
        source = RestSource(
            settings(server, timeout=0.2, max_retries=1), RestRead(path="/slow", model=Item)
        )
        with pytest.raises(SourceError) as failed:
            list(source.extract().artifact.rows())
    assert failed.value.code == "rest_request_failed" and "Timeout" in failed.value.message
    assert len(server.requests) == 2


def test_an_invalid_record_aborts_the_load_and_names_it(api: ApiServer, target_dsn: str) -> None:
    bad = dict(item(4), price="not a price")
    pages_with_bad = [PAGES[0], [item(3), bad], PAGES[2]]

    def respond(request: Request) -> Reply:
        page = int(request.query["page"])
        return Reply({"data": pages_with_bad[page - 1] if page <= 3 else []})

    server, result, caught, terminal = stage_failing(respond, target_dsn)
    assert caught.value.code == "rest_record_invalid"
    assert "Page 2, record 1 (id=4)" in caught.value.message
    assert "price" in caught.value.message and "not a price" not in caught.value.message
    assert len(server.requests) == 2  # nothing after the bad page
    assert result.extraction_receipt.state is ReceiptState.ACQUIRED
    assert terminal.outcome is TerminalOutcome.ABORT and terminal.sources_closed
    assert staging_tables(target_dsn) == []


def test_a_server_that_drops_the_socket_midway_aborts_with_staging_gone(target_dsn: str) -> None:
    def respond(request: Request) -> Reply | object:
        page = int(request.query["page"])
        return DROP if page == 3 else Reply({"data": PAGES[page - 1]})

    server, result, caught, terminal = stage_failing(respond, target_dsn)
    assert caught.value.code == "rest_request_failed"
    assert "RemoteProtocolError" in caught.value.message
    assert [r.query["page"] for r in server.requests] == ["1", "2", "3", "3", "3"]
    assert result.extraction_receipt.extraction_completed_at is None
    assert terminal.outcome is TerminalOutcome.ABORT and terminal.sources_closed
    assert staging_tables(target_dsn) == []


def test_completion_only_after_exhaustion(api: ApiServer) -> None:
    source = RestSource(
        settings(api),
        RestRead(path="/items", model=Item, records_path="data", pagination=PageNumberPagination()),
    )
    result = source.extract()
    assert result.extraction_receipt.state is ReceiptState.PENDING and api.requests == []
    rows = result.artifact.rows()
    assert next(rows)[0] == 1
    assert result.extraction_receipt.state is ReceiptState.ACQUIRED and len(api.requests) == 1
    assert [r[0] for r in [next(rows) for _ in range(4)]] == [2, 3, 4, 5]
    # Every row was handed out, but the source has not yet said "no more": not complete.
    assert result.extraction_receipt.extraction_completed_at is None
    assert list(rows) == []
    assert result.extraction_receipt.state is ReceiptState.COMPLETED
    assert len(api.requests) == 4  # the empty page proved exhaustion
    terminal = result.artifact.success()
    assert terminal.outcome is TerminalOutcome.SUCCESS and terminal.sources_closed


def test_an_unmappable_field_fails_before_any_request(api: ApiServer) -> None:
    class Odd(BaseModel):
        id: int
        either: int | str

    with pytest.raises(SourceError) as caught:
        RestSource(settings(api), RestRead(path="/items", model=Odd))
    assert caught.value.code == "rest_type_unmappable" and "Odd.either" in caught.value.message
    assert api.requests == []


def test_a_pagination_loop_is_refused(target_dsn: str) -> None:
    with ApiServer(lambda r: Reply({"items": [item(1)], "next": "/same"})) as server:
        source = RestSource(
            settings(server),
            RestRead(
                path="/same", model=Item, records_path="items", pagination=NextLinkPagination()
            ),
        )
        with pytest.raises(SourceError) as caught:
            list(source.extract().artifact.rows())
    assert caught.value.code == "rest_pagination_loop"
