"""The parts every materialization's and check's metadata is built of: a read's receipt and
its rates, snapshot digests, timestamps, and what a load changed in its target's schema and
catalog.

Standard keys where Dagster has one, dpone's own under ``dpone/``, the keys several jobs write
(:class:`~dpone_dagster.dagster.metadata.keys.common.CommonMetadataSet`) built through it;
figures that vary run over run (rows, bytes, seconds, rows per second, lag) are numbers, so the
UI plots them.
"""

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import dagster as dg

from dpone_dagster.postgres import TargetTypes
from dpone_dagster.postgres.schema_change import ColumnChange

from .keys.common import CommonMetadataSet

if TYPE_CHECKING:
    from .keys.batch import BatchMetadataSet

CHECK_NAME = "dpone_reconciled"
"""The asset check every dpone asset declares: the target holds what the source held."""


def short_digest(digest: str) -> str:
    """A digest short enough for a tag's column: ``sha256:`` and its first 12 hex digits.

    Examples:
        >>> short_digest("sha256:" + "ab" * 32)
        'sha256:abababababab'
    """
    kind, sep, hexits = digest.partition(":")
    return f"{kind}:{hexits[:12]}" if sep else digest[:12]


def rate_metadata(
    rows: int, byte_count: int | None, started: datetime | None, completed: datetime | None
) -> dict[str, Any]:
    """Bytes, extraction seconds, rows per second and lag, as numbers.

    ``dpone/lag_seconds`` is how old the source state the target now holds is: the seconds from
    the start of the source read to this report.
    """
    if started is None or completed is None:
        return dict(CommonMetadataSet(bytes=byte_count or 0))
    seconds = (completed - started).total_seconds()
    return dict(
        CommonMetadataSet(
            bytes=byte_count or 0,
            extraction_seconds=seconds,
            rows_per_second=round(rows / seconds) if seconds else 0,
            lag_seconds=(datetime.now(UTC) - started).total_seconds(),
        )
    )


def created_metadata(created: TargetTypes, virtual_as_stored: Sequence[str]) -> dict[str, Any]:
    """What a load created in its target for a table beyond its rows: ``dpone/types_created``,
    ``dpone/enum_labels_added``, ``dpone/extensions_created`` and ``dpone/virtual_as_stored``,
    each only when there is something to list."""
    types = [
        {"type": t.qualified, "kind": t.kind, "definition": t.describe()} for t in created.types
    ]
    labels = [
        {"type": ".".join(label.type), "label": label.label, "before": label.before}
        for label in created.labels
    ]
    extensions = [
        {"extension": e.name, "version": e.version, "schema": e.schema,
         "source_version": e.source_version}
        for e in created.extensions
    ]  # fmt: skip
    stored = [{"column": c, "source": "VIRTUAL", "target": "STORED"} for c in virtual_as_stored]

    def listed(entries: list[dict[str, Any]]) -> dg.JsonMetadataValue | None:
        return dg.MetadataValue.json(entries) if entries else None

    return dict(
        CommonMetadataSet(
            types_created=listed(types),
            enum_labels_added=listed(labels),
            extensions_created=listed(extensions),
            virtual_as_stored=listed(stored),
        )
    )


def schema_change_metadata(changes: Sequence[ColumnChange]) -> dict[str, Any]:
    """``dpone/schema_changes``: what a load changed in its target's schema, one entry per
    column (``column``, ``kind``: added, widened or kept, ``before``, ``after``, ``detail``);
    nothing when the schema was left as it was."""
    if not changes:
        return {}
    entries = [
        {"column": c.column, "kind": c.kind, "before": c.before, "after": c.after,
         "detail": c.detail}
        for c in changes
    ]  # fmt: skip
    return dict(CommonMetadataSet(schema_changes=dg.MetadataValue.json(entries)))


def log_schema_changes(
    log: dg.DagsterLogManager, target: str, changes: Sequence[ColumnChange]
) -> None:
    """Logs one line naming each difference of ``target``'s columns from the source's (added,
    widened, kept), or nothing when there is none."""
    if changes:
        listed = "; ".join(c.describe() for c in changes)
        log.info(f"Schema of {target} against the source: {listed}.")


def snapshot_digests(tokens: Sequence[str]) -> str | None:
    """One snapshot token's digest, a JSON list of several, or None without any."""
    if not tokens:
        return None
    return tokens[0] if len(tokens) == 1 else json.dumps(tokens)


def timestamp_value(at: datetime | None) -> dg.TimestampMetadataValue | None:
    """``at`` as a timestamp the UI shows in the reader's zone (None stays None)."""
    return None if at is None else dg.MetadataValue.timestamp(at)


def progress_observation(
    key: dg.AssetKey, progress: "BatchMetadataSet", partition: str | None = None
) -> dg.AssetObservation:
    """A committed batch's observation, as the UI shows it while the run goes on: its
    ``dpone/progress_*`` keys (``progress``), plotted apart from the materialization's figures."""
    return dg.AssetObservation(asset_key=key, partition=partition, metadata=dict(progress))
