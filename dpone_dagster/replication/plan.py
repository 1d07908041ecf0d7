"""The old name of :mod:`.group_plan` (a replication group and its tables' plans), kept for one
release: importing it warns (``DeprecationWarning``); import from
:mod:`dpone_dagster.replication.group_plan` instead."""

from __future__ import annotations

import warnings

from .group_plan import (
    ReplicationGroup,
    refuse_keyless,
    refuse_keyless_table,
    relation_columns,
    relation_plan,
)

__all__ = [
    "ReplicationGroup",
    "refuse_keyless",
    "refuse_keyless_table",
    "relation_columns",
    "relation_plan",
]

warnings.warn(
    "dpone_dagster.replication.plan is now dpone_dagster.replication.group_plan: import "
    "ReplicationGroup from there (the old module is removed in the next release).",
    DeprecationWarning,
    stacklevel=2,
)
