"""The one owner of an extraction's current receipt."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from .errors import LifecycleError
from .receipt import (
    ORCHESTRATOR_UTC,
    ExtractionLifecycleReceipt,
    ReceiptState,
    SnapshotEvidence,
    token_digest,
)


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _open_window(receipt: ExtractionLifecycleReceipt, action: str) -> ExtractionLifecycleReceipt:
    """Returns ``receipt`` if its window is open (acquired, not completed), else raises."""
    if receipt.state is ReceiptState.PENDING:
        raise LifecycleError(
            "lifecycle_not_acquired",
            f"Cannot {action} before the extraction window was acquired.",
            ["Call acquire() at the source-read boundary first."],
        )
    if receipt.state is ReceiptState.COMPLETED:
        raise LifecycleError(
            "lifecycle_completed",
            f"Cannot {action}: the extraction already completed and its receipt is final.",
            ["Start a new extraction with a new authority."],
        )
    return receipt


class ExtractionLifecycleAuthority:
    """Owns one extraction's current :class:`ExtractionLifecycleReceipt`.

    Each transition builds a new frozen receipt and swaps it in under a lock, so a reader on any
    thread sees either the old receipt or the new one, never a mix, and no receipt that a
    component already holds ever changes. Transitions go forward only:
    ``pending -> acquired -> (snapshot) -> completed``.

    Args:
        clock: The orchestrator clock used when a transition is given no server timestamp.

    Examples:
        >>> authority = ExtractionLifecycleAuthority()
        >>> authority.receipt.state.value
        'pending'
        >>> _ = authority.acquire()
        >>> _ = authority.complete(row_count=3, byte_count=120)
        >>> authority.receipt.state.value
        'completed'
    """

    def __init__(self, *, clock: Callable[[], datetime] = _utc_now) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._receipt = ExtractionLifecycleReceipt()

    @property
    def receipt(self) -> ExtractionLifecycleReceipt:
        """The latest published receipt (immutable)."""
        return self._receipt

    @property
    def is_pending(self) -> bool:
        """True until :meth:`acquire` opened the read window."""
        return self._receipt.state is ReceiptState.PENDING

    @property
    def is_completed(self) -> bool:
        """True once :meth:`complete` published the row/byte receipt."""
        return self._receipt.state is ReceiptState.COMPLETED

    def _publish(
        self, current: ExtractionLifecycleReceipt, **changes: Any
    ) -> ExtractionLifecycleReceipt:
        data = current.model_dump()
        data.update(changes)
        # model_validate (not model_copy) so the honesty validators run on every new receipt.
        receipt = ExtractionLifecycleReceipt.model_validate(data)
        self._receipt = receipt
        return receipt

    def acquire(
        self, *, started_at: datetime | None = None, clock_authority: str = ORCHESTRATOR_UTC
    ) -> ExtractionLifecycleReceipt:
        """Opens the read window at the truthful source-read boundary.

        Args:
            started_at: The window's start as the issuing clock saw it; defaults to the
                orchestrator's UTC clock now.
            clock_authority: The clock that issued ``started_at``. Pass a server clock
                (``postgresql.clock_timestamp``) only when the server really issued the time.

        Returns:
            The new receipt.

        Raises:
            LifecycleError: ``lifecycle_already_acquired`` when the window is already open.
        """
        with self._lock:
            current = self._receipt
            if current.state is not ReceiptState.PENDING:
                raise LifecycleError(
                    "lifecycle_already_acquired",
                    "The extraction window was already acquired; a window opens once.",
                    ["Create a new authority for a new extraction."],
                )
            if started_at is None:
                if clock_authority != ORCHESTRATOR_UTC:
                    raise LifecycleError(
                        "lifecycle_clock_unproven",
                        f"Clock authority {clock_authority!r} was named without its timestamp.",
                        ["Pass the timestamp the server issued, or use the orchestrator clock."],
                    )
                started_at = self._clock()
            return self._publish(
                current, extraction_started_at=started_at, clock_authority=clock_authority
            )

    def acquire_snapshot(self, evidence: SnapshotEvidence) -> ExtractionLifecycleReceipt:
        """Records that a real vendor snapshot exists for the open window.

        Only the digest of ``evidence.token`` enters the receipt.

        Args:
            evidence: The server-issued token, its issuer and the server time it existed.

        Returns:
            The new receipt.

        Raises:
            LifecycleError: ``lifecycle_not_acquired`` before :meth:`acquire`,
                ``lifecycle_snapshot_already_acquired`` when a snapshot was already recorded,
                ``lifecycle_clock_mismatch`` when the evidence is dated by another clock than
                the window, ``lifecycle_completed`` after completion.
        """
        with self._lock:
            current = _open_window(self._receipt, "record a snapshot")
            if current.has_snapshot:
                raise LifecycleError(
                    "lifecycle_snapshot_already_acquired",
                    "This extraction already records a snapshot; one window has one snapshot.",
                    ["Use a new authority for a read under another snapshot."],
                )
            if evidence.clock_authority != current.clock_authority:
                raise LifecycleError(
                    "lifecycle_clock_mismatch",
                    f"The window is dated by {current.clock_authority!r} but the snapshot by "
                    f"{evidence.clock_authority!r}; one receipt has one clock.",
                    ["Acquire the window with the clock of the server that issues the snapshot."],
                )
            return self._publish(
                current,
                snapshot_acquired_at=evidence.acquired_at,
                snapshot_authority=evidence.authority,
                source_token=token_digest(evidence.token),
            )

    def complete(
        self,
        *,
        row_count: int,
        byte_count: int | None = None,
        completed_at: datetime | None = None,
    ) -> ExtractionLifecycleReceipt:
        """Closes the window after every row or byte was consumed and counted.

        Args:
            row_count: Rows consumed, as authoritative evidence (a COPY tag, a counted stream).
            byte_count: Bytes consumed, where the extraction produced bytes.
            completed_at: The end as the receipt's clock saw it; defaults to the orchestrator's
                clock now (only valid when that is the receipt's clock).

        Returns:
            The completed receipt.

        Raises:
            LifecycleError: ``lifecycle_not_acquired`` before :meth:`acquire`,
                ``lifecycle_completed`` when already completed.
        """
        with self._lock:
            current = _open_window(self._receipt, "complete")
            if completed_at is None:
                if current.clock_authority != ORCHESTRATOR_UTC:
                    raise LifecycleError(
                        "lifecycle_clock_unproven",
                        f"The window is dated by {current.clock_authority!r}; "
                        "its completion needs that clock's timestamp.",
                        ["Read the completion time from the same server clock."],
                    )
                completed_at = self._clock()
            return self._publish(
                current,
                extraction_completed_at=completed_at,
                row_count=row_count,
                byte_count=byte_count,
            )
