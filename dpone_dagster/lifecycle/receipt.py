"""The immutable extraction lifecycle receipt and the evidence that may change it.

A receipt answers one question truthfully: when did the source read really begin and end, whose
clock said so, and under which snapshot (if any)? It is a frozen pydantic model; the only way to
"change" one is for its :class:`~dpone_dagster.lifecycle.authority.ExtractionLifecycleAuthority`
to publish a new one. Its validators make a dishonest receipt impossible to construct: a completed
window without a start, snapshot fields without a snapshot authority, or a raw snapshot token where
only its digest belongs.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ORCHESTRATOR_UTC = "dpone.orchestrator.utc"
"""Clock authority of the orchestrator's own UTC clock (generic adapters; no snapshot claim)."""

_TOKEN_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def token_digest(token: str | bytes) -> str:
    """Returns the ``sha256:<hex>`` digest of a server-issued snapshot token.

    The raw token (for PostgreSQL, ``pg_current_snapshot()`` or ``pg_export_snapshot()`` text) is
    never stored in a receipt: the digest proves which snapshot was used without handing out a
    value that could be replayed with ``SET TRANSACTION SNAPSHOT``.

    Args:
        token: The token exactly as the server issued it.

    Returns:
        ``"sha256:"`` followed by 64 lowercase hex digits.
    """
    raw = token.encode() if isinstance(token, str) else token
    return "sha256:" + hashlib.sha256(raw).hexdigest()


class ReceiptState(StrEnum):
    """Where a receipt's extraction window stands."""

    PENDING = "pending"
    """No source read has begun (a lazy artifact before its first consumption)."""
    ACQUIRED = "acquired"
    """The read window is open: ``extraction_started_at`` is known, completion is not."""
    COMPLETED = "completed"
    """Every row or byte was consumed and its row/byte receipt published."""


def _as_utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("lifecycle timestamps must be timezone-aware")
    return value.astimezone(UTC)


class ExtractionLifecycleReceipt(BaseModel):
    """An immutable statement of one extraction's source-read window.

    Attributes:
        extraction_started_at: UTC start of the observed source-read window; ``None`` while the
            receipt is pending.
        clock_authority: The clock that issued the window's timestamps, such as
            ``dpone.orchestrator.utc`` or ``postgresql.clock_timestamp``.
        extraction_completed_at: ``None`` until every row or byte was consumed and counted.
        snapshot_acquired_at: When a real vendor snapshot existed; only with snapshot evidence.
        snapshot_authority: What issued the snapshot (``postgresql.pg_current_snapshot``...).
        source_token: Digest of the server-issued snapshot token; only with snapshot evidence.
        row_count: Rows consumed, published at completion.
        byte_count: Bytes consumed, published at completion (``None`` where no bytes exist).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    extraction_started_at: datetime | None = None
    clock_authority: str = Field(default=ORCHESTRATOR_UTC, min_length=1)
    extraction_completed_at: datetime | None = None
    snapshot_acquired_at: datetime | None = None
    snapshot_authority: str | None = None
    source_token: str | None = None
    row_count: int | None = Field(default=None, ge=0)
    byte_count: int | None = Field(default=None, ge=0)

    @field_validator(
        "extraction_started_at", "extraction_completed_at", "snapshot_acquired_at", mode="after"
    )
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return _as_utc(value)

    @model_validator(mode="after")
    def _honest(self) -> Self:
        if self.extraction_completed_at is not None:
            if self.extraction_started_at is None:
                raise ValueError("a completed receipt needs extraction_started_at")
            if self.extraction_completed_at < self.extraction_started_at:
                raise ValueError("extraction_completed_at precedes extraction_started_at")
            if self.row_count is None:
                raise ValueError("a completed receipt publishes its row count")
        elif self.row_count is not None or self.byte_count is not None:
            raise ValueError("row and byte counts are published only at completion")
        has_snapshot = self.snapshot_authority is not None
        if has_snapshot != (self.snapshot_acquired_at is not None):
            raise ValueError("snapshot_authority and snapshot_acquired_at go together")
        if self.source_token is not None:
            if not has_snapshot:
                raise ValueError("source_token needs snapshot evidence (snapshot_authority)")
            if not _TOKEN_DIGEST.match(self.source_token):
                raise ValueError("source_token must be a sha256 digest, never the raw token")
        if has_snapshot and self.extraction_started_at is None:
            raise ValueError("a snapshot is acquired only inside an open extraction window")
        if has_snapshot and self.clock_authority == ORCHESTRATOR_UTC:
            raise ValueError(
                "a snapshot claim needs the clock of the server that issued it, "
                f"not {ORCHESTRATOR_UTC}"
            )
        return self

    @property
    def state(self) -> ReceiptState:
        """Whether the window is pending, acquired (open) or completed."""
        if self.extraction_completed_at is not None:
            return ReceiptState.COMPLETED
        if self.extraction_started_at is not None:
            return ReceiptState.ACQUIRED
        return ReceiptState.PENDING

    @property
    def has_snapshot(self) -> bool:
        """True when the receipt carries a vendor snapshot claim."""
        return self.snapshot_authority is not None


class SnapshotEvidence(BaseModel):
    """Proof that a real vendor snapshot exists, handed to ``acquire_snapshot``.

    The raw ``token`` stays inside this object: the authority publishes only its digest.

    Attributes:
        authority: What issued the snapshot, such as ``postgresql.pg_export_snapshot``.
        token: The snapshot token exactly as the server issued it.
        acquired_at: When the snapshot existed, by the server's clock.
        clock_authority: The clock that issued ``acquired_at``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    authority: str = Field(min_length=1)
    token: str = Field(min_length=1, repr=False)
    acquired_at: datetime
    clock_authority: str = Field(min_length=1)

    @field_validator("acquired_at", mode="after")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        result = _as_utc(value)
        assert result is not None
        return result

    @field_validator("clock_authority", mode="after")
    @classmethod
    def _server_clock(cls, value: str) -> str:
        if value == ORCHESTRATOR_UTC:
            raise ValueError("snapshot evidence is dated by the server's clock")
        return value
