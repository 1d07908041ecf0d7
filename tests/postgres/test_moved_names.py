"""The snapshot copy engine moved out of the toolkit (#45): the names ``dpone_dagster.postgres``
exported still import from there for one release, as the very objects of
``dpone_dagster.snapshot_copy``, each with a ``DeprecationWarning`` naming its new home; so does
the replication group plan's old module."""

from __future__ import annotations

import importlib
import sys

import pytest

import dpone_dagster.postgres
import dpone_dagster.snapshot_copy

MOVED = sorted(dpone_dagster.snapshot_copy.__all__)


@pytest.mark.parametrize("name", MOVED)
def test_a_moved_name_still_imports_from_the_toolkit_with_a_warning(name: str) -> None:
    with pytest.warns(DeprecationWarning, match=rf"moved to dpone_dagster\.snapshot_copy\.{name}"):
        lent = getattr(dpone_dagster.postgres, name)
    assert lent is getattr(dpone_dagster.snapshot_copy, name)
    assert name not in dpone_dagster.postgres.__all__, "the toolkit lends it, it does not own it"


def test_from_import_of_a_moved_name_works_and_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.warns(DeprecationWarning, match="removed in the next release"):
        from dpone_dagster.postgres import SnapshotCopy, copy_tables
    assert SnapshotCopy is dpone_dagster.snapshot_copy.SnapshotCopy
    assert copy_tables is dpone_dagster.snapshot_copy.copy_tables
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        dpone_dagster.postgres.no_such_name  # noqa: B018


def test_the_group_plans_old_module_still_imports_with_a_warning() -> None:
    from dpone_dagster.replication.group_plan import ReplicationGroup

    sys.modules.pop("dpone_dagster.replication.plan", None)
    with pytest.warns(DeprecationWarning, match=r"replication\.plan is now .*group_plan"):
        old = importlib.import_module("dpone_dagster.replication.plan")
    assert old.ReplicationGroup is ReplicationGroup
