"""Every ``dpone/`` key, declared once: :class:`DponeMetadataSet` (metadata of asset specs,
materializations, observations, checks and failures; in :mod:`.keys`) and :class:`DponeRunTags`
(tags of runs and ops; in :mod:`.tags`), both importable from here, with what reads and
documents them: :func:`metadata_key`, :func:`read_metadata`, :func:`markdown_reference`.

Each field is one key (``rows_loaded`` is ``dpone/rows_loaded``), typed as its value is (numbers
stay numbers, so the UI plots them; JSON and Markdown as Dagster's metadata values) and
documented by its docstring, where it says on what it appears: *copy* (a snapshot copy's
materialization, and the extraction job's), *partition* (a backfill partition's), *batch* (the
observation of a committed batch), *incremental* (an incremental run's), *replication* (a
replicated table's, one per table of the group), *check of a slot* (``dpone_slot_healthy``),
*generic* (a MySQL or
REST copy's), *spec* (an asset definition), *check* (a ``dpone_reconciled`` result), *failure*
(a :class:`~dpone_dagster.DponeFailure`), *kafka* (a Kafka topic's copy). Metadata is built as
``dict(DponeMetadataSet(...))`` and read back with :func:`read_metadata`; the docs'
metadata reference (docs/metadata.md) is generated from these docstrings
(:func:`markdown_reference`).

The standard keys (``dagster/row_count``, ``dagster/table_name``, ``dagster/column_schema``,
``dagster/column_lineage``) are Dagster's ``TableMetadataSet``.
"""

from collections.abc import Mapping, Sequence
from typing import Any, get_args

import dagster as dg

from .keys import NAMESPACE, DponeMetadataSet, readable_number
from .tags import DponeRunTags

__all__ = [
    "NAMESPACE",
    "DponeMetadataSet",
    "DponeRunTags",
    "markdown_reference",
    "metadata_key",
    "read_metadata",
    "readable_number",
]


def bullets(items: Sequence[str]) -> str:
    """``items`` as a Markdown list, one a line (next actions, in metadata and descriptions).

    Examples:
        >>> print(bullets(["Run again.", "Or resync."]))
        - Run again.
        - Or resync.
    """
    return "\n".join(f"- {item}" for item in items)


def metadata_key(field: str) -> str:
    """The ``dpone/`` key of a declared metadata field or run tag.

    Raises:
        KeyError: for a field neither set declares.

    Examples:
        >>> metadata_key("error_code")
        'dpone/error_code'
    """
    if field not in DponeMetadataSet.model_fields and field not in DponeRunTags.model_fields:
        raise KeyError(f"dpone declares no key {field!r}")
    return f"{NAMESPACE}/{field}"


def read_metadata(metadata: Mapping[str, Any], *fields: str) -> DponeMetadataSet:
    """The declared ``fields`` of ``metadata`` (a spec's, a recorded materialization's), as
    their values (a recorded ``TextMetadataValue`` is read as its text); other keys are left
    alone, so a key an older version wrote with another type does not matter here.

    Examples:
        >>> read_metadata({"dpone/table": "a.b", "dpone/copied": "x"}, "table").table
        'a.b'
    """
    wanted = {metadata_key(f) for f in fields}
    return DponeMetadataSet.extract({k: v for k, v in metadata.items() if k in wanted})


_KINDS = {
    str: "text",
    int: "int",
    float: "float",
    bool: "bool",
    dg.JsonMetadataValue: "JSON",
    dg.MarkdownMetadataValue: "Markdown",
    dg.TimestampMetadataValue: "timestamp",
}


def markdown_reference() -> str:
    """The docs' table of every ``dpone/`` key (docs/metadata.md): its value and its docstring."""
    rows = ["| Key | Value | What it is (on) |", "| --- | --- | --- |"]
    for kind, model in (("", DponeMetadataSet), ("run tag: ", DponeRunTags)):
        for name, field in model.model_fields.items():
            [value] = [t for t in get_args(field.annotation) if t is not type(None)]
            doc = " ".join((field.description or "").split()).replace("``", "`")
            rows.append(f"| `{NAMESPACE}/{name}` | {kind}{_KINDS[value]} | {doc} |")
    return "\n".join(rows) + "\n"
