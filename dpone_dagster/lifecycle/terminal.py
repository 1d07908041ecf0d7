"""Terminal outcomes: one idempotent decision per artifact, and what it does to files and sources.

=========================  ==========================  ===============  ========================
outcome                    meaning                     file evidence    source cursor/transaction
=========================  ==========================  ===============  ========================
``success``                target commit acknowledged  cleaned          commit, close
``abort``                  load did not commit         cleaned          rollback, close
``retain_commit_unknown``  commit ack is ambiguous     retained         rollback, close
=========================  ==========================  ===============  ========================

Retention applies to durable diagnostic evidence (files) only. A live cursor or a read-only
transaction is never evidence, so it is closed whatever the outcome. Cleanup is best effort: a
failure is recorded as a stable ``cleanup_error_code`` in the receipt and never raised, so it can
never replace the load's primary exception.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .errors import LifecycleError
from .redaction import redact


class TerminalOutcome(StrEnum):
    """The three ways an artifact's life can end."""

    SUCCESS = "success"
    """The target acknowledged its commit."""
    ABORT = "abort"
    """The load did not commit."""
    RETAIN_COMMIT_UNKNOWN = "retain_commit_unknown"
    """The commit was sent but its acknowledgement was lost: the target may or may not have it."""


CleanupErrorCode = Literal[
    "file_release_failed",
    "source_commit_failed",
    "source_rollback_failed",
]


class ArtifactTerminalReceipt(BaseModel):
    """What an artifact's terminal decision did, decided once and returned on every repeat.

    Attributes:
        artifact_id: The root artifact this decision belongs to (views share it).
        outcome: The decision.
        decided_at: When the decision was taken (orchestrator UTC clock).
        released_files: Evidence files this decision deleted.
        retained_files: Evidence files kept on purpose (``retain_commit_unknown``) or left behind
            because their deletion failed.
        source_action: ``commit`` on success, ``rollback`` otherwise, ``none`` when the artifact
            held no live source.
        sources_closed: True when every live source cursor and transaction is closed.
        cleanup_succeeded: False when any deletion or source release failed.
        cleanup_error_code: Stable code of the first cleanup failure.
        cleanup_error_detail: What failed, redacted.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    artifact_id: str
    outcome: TerminalOutcome
    decided_at: datetime
    released_files: tuple[str, ...] = ()
    retained_files: tuple[str, ...] = ()
    source_action: Literal["commit", "rollback", "none"]
    sources_closed: bool
    cleanup_succeeded: bool
    cleanup_error_code: CleanupErrorCode | None = None
    cleanup_error_detail: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ArtifactTerminalReceipt:
        if self.cleanup_succeeded and self.cleanup_error_code is not None:
            raise ValueError("cleanup_succeeded cannot be true with a cleanup_error_code")
        if not self.cleanup_succeeded and self.cleanup_error_code is None:
            raise ValueError("a failed cleanup records its cleanup_error_code")
        expected = "commit" if self.outcome is TerminalOutcome.SUCCESS else "rollback"
        if self.source_action not in (expected, "none"):
            raise ValueError(f"{self.outcome.value} requires source_action {expected!r}")
        retaining = self.outcome is TerminalOutcome.RETAIN_COMMIT_UNKNOWN
        if self.retained_files and not retaining and self.cleanup_succeeded:
            raise ValueError("files are retained only for retain_commit_unknown or a failure")
        if self.released_files and retaining:
            raise ValueError("retain_commit_unknown never deletes evidence files")
        return self


@runtime_checkable
class LiveSource(Protocol):
    """A live source resource an artifact holds: a cursor, a read-only transaction, a session."""

    def commit_and_close(self) -> None:
        """Ends the source transaction with COMMIT and closes every cursor and session."""

    def rollback_and_close(self) -> None:
        """Ends the source transaction with ROLLBACK and closes every cursor and session."""


class FileRelease(BaseModel):
    """The result of the exactly-once physical release of an artifact's files."""

    model_config = ConfigDict(frozen=True)

    released: tuple[str, ...] = ()
    retained: tuple[str, ...] = ()
    error_detail: str | None = None
    failed: bool = Field(default=False)


class FileReleaseAuthority:
    """Deletes (or retains) an artifact's evidence files exactly once, for every view.

    Files are registered as the extraction writes them. The first :meth:`release` or
    :meth:`retain` settles them all; later calls return that same result, so no view of the
    artifact can delete files that a root decision retained, or the other way round.
    """

    def __init__(self, paths: Iterable[str | os.PathLike[str]] = ()) -> None:
        self._lock = threading.Lock()
        self._paths: list[Path] = [Path(p) for p in paths]
        self._result: FileRelease | None = None

    @property
    def paths(self) -> tuple[Path, ...]:
        """Every file registered so far."""
        with self._lock:
            return tuple(self._paths)

    @property
    def result(self) -> FileRelease | None:
        """The settled release, or None while the files are still live."""
        return self._result

    def register(self, path: str | os.PathLike[str]) -> None:
        """Adds a newly written evidence file.

        Raises:
            LifecycleError: ``artifact_files_settled`` when the files were already released or
                retained (a file written after the terminal decision would be orphaned).
        """
        with self._lock:
            if self._result is not None:
                raise LifecycleError(
                    "artifact_files_settled",
                    f"File {path} was written after the artifact's files were settled.",
                    ["Write every file before the terminal decision."],
                )
            self._paths.append(Path(path))

    def retain(self) -> FileRelease:
        """Keeps every file as evidence. Idempotent; returns the first settlement."""
        with self._lock:
            if self._result is None:
                self._result = FileRelease(retained=tuple(str(p) for p in self._paths))
            return self._result

    def release(self) -> FileRelease:
        """Deletes every file once. Idempotent; returns the first settlement.

        A file already gone counts as released. A deletion that fails (the path became a
        directory, the filesystem refused) leaves the file listed as retained and the result
        marked failed; no exception escapes.
        """
        with self._lock:
            if self._result is not None:
                return self._result
            released: list[str] = []
            retained: list[str] = []
            errors: list[str] = []
            for path in self._paths:
                try:
                    path.unlink(missing_ok=True)
                except OSError as exc:
                    retained.append(str(path))
                    errors.append(f"{path}: {type(exc).__name__}: {redact(str(exc))}")
                else:
                    released.append(str(path))
            self._result = FileRelease(
                released=tuple(released),
                retained=tuple(retained),
                error_detail="; ".join(errors) or None,
                failed=bool(errors),
            )
            return self._result


class TerminalAuthority:
    """Takes an artifact's one terminal decision and carries it out.

    The first :meth:`decide` wins; any later call, with any outcome and from any view, returns the
    same :class:`ArtifactTerminalReceipt`. Deciding never raises because of cleanup: failures are
    recorded in the receipt.

    Args:
        files: The artifact's (shared) file release authority.
        artifact_id: A stable id; a random one when omitted.
    """

    def __init__(self, files: FileReleaseAuthority, *, artifact_id: str | None = None) -> None:
        self.artifact_id = artifact_id or f"artifact-{uuid.uuid4().hex}"
        self.files = files
        self._lock = threading.RLock()
        self._sources: list[LiveSource] = []
        self._receipt: ArtifactTerminalReceipt | None = None

    @property
    def receipt(self) -> ArtifactTerminalReceipt | None:
        """The terminal receipt, or None while the artifact is undecided."""
        return self._receipt

    @property
    def decided(self) -> bool:
        """True once a terminal decision was taken."""
        return self._receipt is not None

    def attach_source(self, source: LiveSource) -> None:
        """Binds a live source (cursor, transaction) whose end the decision will decide.

        A source attached after the decision cannot be left open: it is rolled back and closed
        at once and :class:`LifecycleError` ``artifact_already_settled`` is raised.
        """
        with self._lock:
            if self._receipt is None:
                self._sources.append(source)
                return
        try:
            source.rollback_and_close()
        finally:
            raise LifecycleError(
                "artifact_already_settled",
                "A live source was attached after the artifact's terminal decision; it was "
                "rolled back and closed.",
                ["Open sources before settling the artifact."],
            )

    def decide(self, outcome: TerminalOutcome | str) -> ArtifactTerminalReceipt:
        """Takes the terminal decision (first one wins) and returns its receipt.

        Args:
            outcome: ``success``, ``abort`` or ``retain_commit_unknown``.

        Returns:
            The receipt of the first decision, whatever ``outcome`` this call asked for.
        """
        outcome = TerminalOutcome(outcome)
        with self._lock:
            if self._receipt is not None:
                return self._receipt
            error_code: CleanupErrorCode | None = None
            details: list[str] = []
            commit = outcome is TerminalOutcome.SUCCESS
            all_closed = True
            for source in self._sources:
                try:
                    if commit:
                        source.commit_and_close()
                    else:
                        source.rollback_and_close()
                except Exception as exc:  # cleanup never replaces the primary error
                    error_code = error_code or (
                        "source_commit_failed" if commit else "source_rollback_failed"
                    )
                    details.append(f"source: {type(exc).__name__}: {redact(str(exc))}")
                    all_closed = _closed_after_failure(source) and all_closed
            if outcome is TerminalOutcome.RETAIN_COMMIT_UNKNOWN:
                release = self.files.retain()
            else:
                release = self.files.release()
            if release.failed:
                error_code = error_code or "file_release_failed"
                if release.error_detail:
                    details.append(f"files: {release.error_detail}")
            self._receipt = ArtifactTerminalReceipt(
                artifact_id=self.artifact_id,
                outcome=outcome,
                decided_at=datetime.now(UTC),
                released_files=release.released,
                retained_files=release.retained,
                source_action=("commit" if commit else "rollback") if self._sources else "none",
                sources_closed=all_closed,
                cleanup_succeeded=error_code is None,
                cleanup_error_code=error_code,
                cleanup_error_detail="; ".join(details) or None,
            )
            self._sources.clear()
            return self._receipt


def _closed_after_failure(source: LiveSource) -> bool:
    """After a failed commit/rollback, makes a last attempt to close and reports the result."""
    closer = getattr(source, "close", None)
    if closer is None:
        return False
    try:
        closer()
    except Exception:  # best effort
        return False
    closed = getattr(source, "closed", None)
    return bool(closed) if closed is not None else True
