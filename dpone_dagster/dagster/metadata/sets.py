"""Every ``dpone/`` key, declared once: the job's sets (metadata of asset specs,
materializations, observations, checks and failures; one module each in :mod:`.keys`) gathered
into :class:`DponeMetadataSet`, and :class:`DponeRunTags` (tags of runs and ops; in
:mod:`.tags`), all importable from here, with what reads and documents them:
:func:`metadata_key`, :func:`read_metadata`, :func:`markdown_reference`.

Each field is one key (``rows_loaded`` is ``dpone/rows_loaded``), typed as its value is (numbers
stay numbers, so the UI plots them; JSON and Markdown as Dagster's metadata values) and
documented by its docstring, where it says on what it appears: *copy* (a snapshot copy's
materialization, and the extraction job's), *partition* (a backfill partition's), *batch* (the
observation of a committed batch), *incremental* (an incremental run's), *replication* (a
replicated table's, one per table of the group), *check of a slot* (``dpone_slot_healthy``),
*generic* (a MySQL or REST copy's), *spec* (an asset definition), *check* (a
``dpone_reconciled`` result), *failure* (a :class:`~dpone_dagster.DponeFailure`), *kafka* (a
Kafka topic's copy). A job builds its metadata through its own set and the common one
(``dict(CopyMetadataSet(...))``) and reads it back with the set's
:meth:`~.keys.base.DponeSet.read`; the docs' metadata reference (docs/metadata.md) is
generated from these docstrings (:func:`markdown_reference`), one table per set.

This module imports every job's set: the package's jobs import their own (:mod:`.keys`).

The standard keys (``dagster/row_count``, ``dagster/table_name``, ``dagster/column_schema``,
``dagster/column_lineage``) are Dagster's ``TableMetadataSet``.
"""

from collections.abc import Mapping
from typing import Any, get_args

import dagster as dg

from .keys.backfill import PartitionMetadataSet
from .keys.base import NAMESPACE, DponeSet, bullets, readable_number
from .keys.batch import BatchMetadataSet
from .keys.common import CommonMetadataSet, FailureMetadataSet
from .keys.copy import CopyMetadataSet
from .keys.freshness import FreshnessMetadataSet
from .keys.incremental import IncrementalMetadataSet
from .keys.kafka import KafkaMetadataSet
from .keys.replication import ReplicationMetadataSet, SlotMetadataSet
from .keys.stream_check import StreamCheckMetadataSet
from .tags import DponeRunTags

__all__ = [
    "NAMESPACE",
    "SETS",
    "BatchMetadataSet",
    "CommonMetadataSet",
    "CopyMetadataSet",
    "DponeMetadataSet",
    "DponeRunTags",
    "DponeSet",
    "FailureMetadataSet",
    "FreshnessMetadataSet",
    "IncrementalMetadataSet",
    "KafkaMetadataSet",
    "PartitionMetadataSet",
    "ReplicationMetadataSet",
    "SlotMetadataSet",
    "StreamCheckMetadataSet",
    "bullets",
    "markdown_reference",
    "metadata_key",
    "read_metadata",
    "readable_number",
]


class DponeMetadataSet(
    CommonMetadataSet,
    CopyMetadataSet,
    PartitionMetadataSet,
    BatchMetadataSet,
    IncrementalMetadataSet,
    StreamCheckMetadataSet,
    ReplicationMetadataSet,
    SlotMetadataSet,
    KafkaMetadataSet,
    FreshnessMetadataSet,
    FailureMetadataSet,
):
    """Every ``dpone/`` key of every job's set, in one set (each unset field is left out): for
    your own assets, and to read any dpone metadata back.

    Examples:
        >>> dict(DponeMetadataSet(cursor="id", on_changed="repair"))
        {'dpone/on_changed': 'repair', 'dpone/cursor': 'id'}
        >>> DponeMetadataSet.extract({"dpone/checkpoint": "sha256:ab", "other/key": 1}).checkpoint
        'sha256:ab'
    """


SETS: tuple[type[DponeSet], ...] = DponeMetadataSet.__bases__
"""Every job's set, in the order the docs' reference lists them."""


def metadata_key(field: str) -> str:
    """The ``dpone/`` key of a declared metadata field (of any set) or run tag.

    Raises:
        KeyError: for a field no set declares.

    Examples:
        >>> metadata_key("error_code")
        'dpone/error_code'
    """
    if field in DponeRunTags.model_fields:
        return f"{NAMESPACE}/{field}"
    return DponeMetadataSet.key(field)


def read_metadata(metadata: Mapping[str, Any], *fields: str) -> DponeMetadataSet:
    """The declared ``fields`` of ``metadata``, whichever set declares them
    (:meth:`~.keys.base.DponeSet.read` of :class:`DponeMetadataSet`).

    Examples:
        >>> read_metadata({"dpone/table": "a.b", "dpone/copied": "x"}, "table").table
        'a.b'
    """
    return DponeMetadataSet.read(metadata, *fields)


_KINDS = {
    str: "text",
    int: "int",
    float: "float",
    bool: "bool",
    dg.JsonMetadataValue: "JSON",
    dg.MarkdownMetadataValue: "Markdown",
    dg.TimestampMetadataValue: "timestamp",
}


def _words(text: str) -> str:
    """``text`` on one line, its literals in Markdown."""
    return " ".join(text.split()).replace("``", "`")


def _section(model: type[DponeSet] | type[DponeRunTags], kind: str = "") -> list[str]:
    """The reference's section of one set: its name, the first paragraph of its docstring,
    and a table of each key with its value and its docstring."""
    summary = _words((model.__doc__ or "").split("\n\n")[0])
    rows = [f"## `{model.__name__}`", "", summary, "", "| Key | Value | What it is (on) |",
            "| --- | --- | --- |"]  # fmt: skip
    for name, field in model.model_fields.items():
        [value] = [t for t in get_args(field.annotation) if t is not type(None)]
        rows.append(f"| `{NAMESPACE}/{name}` | {kind}{_KINDS[value]} | "
                    f"{_words(field.description or '')} |")  # fmt: skip
    return rows


def markdown_reference() -> str:
    """The docs' reference of every ``dpone/`` key (docs/metadata.md): one section per set, in
    the order of :data:`SETS`, then the run tags'."""
    sections = [*(_section(model) for model in SETS), _section(DponeRunTags, "run tag: ")]
    return "\n\n".join("\n".join(rows) for rows in sections) + "\n"
