"""Deleting (``hard``) or marking (``soft``) the target rows whose key the source has lost.

The keys come from the one drill-down compare (:func:`dpone_dagster.reconcile.compare.compare`:
key digests per range, drilled into differing ranges only). A ``soft`` mark is a
``timestamptz`` column of the target (created if missing):
NULL for a live row, the source snapshot's time once its key is gone; a key that arrives again
clears it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from psycopg import sql

from dpone_dagster.postgres import soft_deletes
from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.delete_keys import delete_keys
from dpone_dagster.postgres.identifiers import TableName
from dpone_dagster.postgres.text_keys import TextKeys
from dpone_dagster.reconcile.compare import Key

from .shape import StreamShape


def matching(shape: StreamShape, keys: Sequence[Key]) -> tuple[sql.Composed, list[object]]:
    """``unnest(...) AS d(k0, ...) WHERE t.key = d.k...`` for ``keys`` (text arrays)."""
    among = TextKeys.of(shape.key, keys, alias="d")
    return sql.SQL("{} WHERE {}").format(among.rows(), among.equal("t")), among.params


def apply_deletes(tgt: Connection, shape: StreamShape, keys: Sequence[Key], at: datetime) -> int:
    """Deletes (``soft``: marks with ``at``) the target rows of ``keys``
    (:func:`~dpone_dagster.postgres.delete_keys.delete_keys`); the rows affected."""
    among = TextKeys.of(shape.key, keys, alias="d")
    return delete_keys(tgt, shape.target, among, soft=shape.soft_column, at=at)


def ensure_soft_column(tgt: Connection, shape: StreamShape) -> None:
    """Adds the stream's soft-delete column to the target if missing
    (:func:`~dpone_dagster.postgres.soft_deletes.ensure_soft_column`)."""
    if shape.soft_column is not None:
        soft_deletes.ensure_soft_column(tgt, shape.target, shape.soft_column)


def revive(tgt: Connection, shape: StreamShape, staging: TableName) -> int:
    """Clears the soft-delete mark of target rows whose key arrives again in ``staging``."""
    if shape.soft_column is None:
        return 0
    key = [k.name for k in shape.key]
    return soft_deletes.revive(tgt, shape.target, shape.soft_column, key, staging)
