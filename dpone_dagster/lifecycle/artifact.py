"""Artifacts (what an extraction hands to the load side) and the result that carries them.

An artifact owns two authorities: the lifecycle authority that publishes its receipt, and the
terminal authority that takes its one terminal decision and releases its files exactly once.
Views (rebinds, projections, wrappers) are new Python objects that hold the *same* two
authorities, so a view can read the newest receipt but can never reverse the root's decision.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable
from typing import Any, Generic, Self, TypeVar

from .authority import ExtractionLifecycleAuthority
from .errors import LifecycleError
from .receipt import ExtractionLifecycleReceipt
from .terminal import (
    ArtifactTerminalReceipt,
    FileReleaseAuthority,
    LiveSource,
    TerminalAuthority,
    TerminalOutcome,
)


class ExtractionArtifact:
    """Base class of every extraction artifact.

    Subclasses add their payload (a file path, a row stream, a batch generator); the lifecycle
    and terminal rules live here once.

    Args:
        lifecycle: The authority that publishes this extraction's receipt. A new pending one
            when omitted (a lazy artifact hands it out before any read).
        files: Evidence files already written.
        artifact_id: A stable id for receipts; random when omitted.
        share_with: Build a wrapper or projection of another artifact: this object then shares
            that artifact's lifecycle and terminal authorities instead of owning new ones.
    """

    def __init__(
        self,
        *,
        lifecycle: ExtractionLifecycleAuthority | None = None,
        files: Iterable[str | os.PathLike[str]] = (),
        artifact_id: str | None = None,
        share_with: ExtractionArtifact | None = None,
    ) -> None:
        if share_with is not None:
            if lifecycle is not None and lifecycle is not share_with.lifecycle:
                raise LifecycleError(
                    "lifecycle_authority_mismatch",
                    "A wrapper must share the lifecycle authority of the artifact it wraps.",
                    ["Pass share_with alone; the authorities come from the wrapped artifact."],
                )
            self._lifecycle = share_with.lifecycle
            self._terminal = share_with.terminal
            for path in files:
                self._terminal.files.register(path)
            self._root: ExtractionArtifact = share_with.root
        else:
            self._lifecycle = lifecycle or ExtractionLifecycleAuthority()
            self._terminal = TerminalAuthority(FileReleaseAuthority(files), artifact_id=artifact_id)
            self._root = self

    @property
    def lifecycle(self) -> ExtractionLifecycleAuthority:
        """The lifecycle authority shared by this artifact and all its views."""
        return self._lifecycle

    @property
    def terminal(self) -> TerminalAuthority:
        """The terminal authority shared by this artifact and all its views."""
        return self._terminal

    @property
    def root(self) -> ExtractionArtifact:
        """The artifact this one is a view of (itself for a root)."""
        return self._root

    @property
    def artifact_id(self) -> str:
        """The root artifact's id."""
        return self._terminal.artifact_id

    @property
    def extraction_receipt(self) -> ExtractionLifecycleReceipt:
        """The lifecycle authority's latest receipt."""
        return self._lifecycle.receipt

    @property
    def terminal_receipt(self) -> ArtifactTerminalReceipt | None:
        """The terminal receipt, or None while undecided."""
        return self._terminal.receipt

    def register_file(self, path: str | os.PathLike[str]) -> None:
        """Registers an evidence file this artifact wrote (released or retained at the end)."""
        self._terminal.files.register(path)

    def attach_source(self, source: LiveSource) -> None:
        """Binds a live source cursor or transaction that the terminal decision will close."""
        self._terminal.attach_source(source)

    def settle(self, outcome: TerminalOutcome | str) -> ArtifactTerminalReceipt:
        """Takes the terminal decision; the first decision of any view wins.

        Args:
            outcome: ``success``, ``abort`` or ``retain_commit_unknown``.

        Returns:
            The receipt of the first decision taken for this artifact or any of its views.
        """
        return self._terminal.decide(outcome)

    def success(self) -> ArtifactTerminalReceipt:
        """The target acknowledged its commit: clean files, commit and close the source."""
        return self.settle(TerminalOutcome.SUCCESS)

    def abort(self) -> ArtifactTerminalReceipt:
        """The load did not commit: clean files, roll back and close the source."""
        return self.settle(TerminalOutcome.ABORT)

    def retain_commit_unknown(self) -> ArtifactTerminalReceipt:
        """The commit acknowledgement was lost: retain files, roll back and close the source."""
        return self.settle(TerminalOutcome.RETAIN_COMMIT_UNKNOWN)

    def view(self, **changes: Any) -> Self:
        """Returns a rebind of this artifact with some public attributes replaced.

        The view shares both authorities with this artifact.

        Args:
            **changes: Public attributes to replace on the view (for example ``columns``).

        Raises:
            LifecycleError: ``artifact_view_invalid`` for a private or unknown attribute.
        """
        clone = copy.copy(self)
        for name, value in changes.items():
            if name.startswith("_") or not hasattr(self, name) or name in _SHARED:
                raise LifecycleError(
                    "artifact_view_invalid",
                    f"{name!r} is not a public payload attribute of {type(self).__name__}.",
                    ["Rebind only payload attributes; authorities are always shared."],
                )
            setattr(clone, name, value)
        return clone


_SHARED = frozenset(
    {"lifecycle", "terminal", "root", "artifact_id", "extraction_receipt", "terminal_receipt"}
)

A = TypeVar("A", bound=ExtractionArtifact)
B = TypeVar("B", bound=ExtractionArtifact)


class ExtractResult(Generic[A]):
    """What an extraction returns: the artifact and, always current, its receipt.

    ``extraction_receipt`` is read from the artifact's authority on every access, so a result
    handed out while the artifact was pending shows the completed receipt once the data was read.

    Args:
        artifact: The artifact (root or view).
    """

    __slots__ = ("_artifact",)

    def __init__(self, artifact: A) -> None:
        self._artifact = artifact

    @property
    def artifact(self) -> A:
        """The artifact this result carries."""
        return self._artifact

    @property
    def lifecycle(self) -> ExtractionLifecycleAuthority:
        """The lifecycle authority bound to both the artifact and this result."""
        return self._artifact.lifecycle

    @property
    def extraction_receipt(self) -> ExtractionLifecycleReceipt:
        """The authority's latest frozen receipt."""
        return self._artifact.lifecycle.receipt

    def rebind(self, artifact: B) -> ExtractResult[B]:
        """Returns a result for a view of the same artifact.

        Raises:
            LifecycleError: ``lifecycle_authority_mismatch`` when ``artifact`` belongs to another
                extraction.
        """
        if artifact.lifecycle is not self.lifecycle:
            raise LifecycleError(
                "lifecycle_authority_mismatch",
                "A result can only be rebound to a view of the same extraction.",
                ["Rebind with artifact.view(...) or a wrapper built with share_with=."],
            )
        return ExtractResult(artifact)
