"""Artifacts, views and results share one authority and always show the latest receipt."""

from __future__ import annotations

import pytest

from dpone_dagster.lifecycle import (
    ExtractionArtifact,
    ExtractionLifecycleAuthority,
    ExtractResult,
    LifecycleError,
    ReceiptState,
)


class FileArtifact(ExtractionArtifact):
    """A minimal payload-carrying artifact, as strategies define them."""

    def __init__(self, path: str, columns: tuple[str, ...], **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.path = path
        self.columns = columns


class Projection(ExtractionArtifact):
    """A wrapper that projects another artifact's columns."""

    def __init__(self, inner: FileArtifact, keep: tuple[str, ...]) -> None:
        super().__init__(share_with=inner)
        self.inner = inner
        self.columns = tuple(c for c in inner.columns if c in keep)


def test_a_lazy_artifact_is_handed_out_with_a_pending_authority() -> None:
    artifact = FileArtifact("/tmp/x", ("a",))
    result = ExtractResult(artifact)
    assert result.extraction_receipt.state is ReceiptState.PENDING
    artifact.lifecycle.acquire()
    assert result.extraction_receipt.state is ReceiptState.ACQUIRED
    artifact.lifecycle.complete(row_count=4)
    assert result.extraction_receipt.state is ReceiptState.COMPLETED
    assert result.extraction_receipt.row_count == 4


def test_results_read_the_latest_receipt_through_views_wrappers_and_rebinds() -> None:
    authority = ExtractionLifecycleAuthority()
    root = FileArtifact("/tmp/root", ("a", "b", "c"), lifecycle=authority)
    first = ExtractResult(root)
    rebound = first.rebind(root.view(columns=("a", "b")))
    wrapped = first.rebind(Projection(root, keep=("a",)))
    for result in (first, rebound, wrapped):
        assert result.lifecycle is authority
        assert result.extraction_receipt.state is ReceiptState.PENDING
    authority.acquire()
    authority.complete(row_count=9)
    for result in (first, rebound, wrapped):
        assert result.extraction_receipt is authority.receipt
        assert result.extraction_receipt.row_count == 9
    assert rebound.artifact.columns == ("a", "b")
    assert wrapped.artifact.columns == ("a",)
    assert root.columns == ("a", "b", "c"), "a view must not change the root's payload"


def test_a_result_cannot_be_rebound_to_another_extraction() -> None:
    result = ExtractResult(FileArtifact("/tmp/a", ("a",)))
    with pytest.raises(LifecycleError) as err:
        result.rebind(FileArtifact("/tmp/b", ("a",)))
    assert err.value.code == "lifecycle_authority_mismatch"


def test_a_view_cannot_replace_its_authorities() -> None:
    root = FileArtifact("/tmp/a", ("a",))
    for name in ("lifecycle", "terminal", "_terminal", "nonexistent"):
        with pytest.raises(LifecycleError) as err:
            root.view(**{name: None})
        assert err.value.code == "artifact_view_invalid"


def test_a_wrapper_cannot_bring_its_own_lifecycle_authority() -> None:
    root = FileArtifact("/tmp/a", ("a",))
    with pytest.raises(LifecycleError) as err:
        ExtractionArtifact(share_with=root, lifecycle=ExtractionLifecycleAuthority())
    assert err.value.code == "lifecycle_authority_mismatch"
