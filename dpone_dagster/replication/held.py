"""A deletes-only batch applied by key, without staging.

A run that applies a few deletes (the slot's changes since the last run were deletes alone)
would pay for a staging table, its ``COPY``, the net effect's sort and the merge sink's
statements for rows it never writes. :class:`~.apply.TableApply` holds such a batch's keys
instead (at most :data:`HELD_DELETES`, as the server sent them), and :func:`delete_held`
applies them in one statement, the one every engine deletes by key with
(:func:`~dpone_dagster.postgres.delete_keys.delete_keys`: the keys' text in one ``text[]``
parameter per key column, cast to the key's types, joined to the target over its key index). A
key deleted once in a batch is its net effect, so nothing is netted. Under ``soft`` deletes the
statement is an ``UPDATE`` that sets the soft-delete column to the deleting transaction's
commit time, on live rows only.

The first insert or update of the batch ends the holding: the held keys are staged in their
order, and the batch goes the staged way (:mod:`.apply`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, TypeAlias

from dpone_dagster.postgres.connection import Connection
from dpone_dagster.postgres.delete_keys import delete_keys
from dpone_dagster.postgres.soft_deletes import ensure_soft_column
from dpone_dagster.postgres.target_plan import TablePlan
from dpone_dagster.postgres.text_keys import TextKeys

from .changes import Value
from .net import NetHook

HELD_DELETES: Final = 10_000
"""Keys of a deletes-only batch held and applied by key without staging (see the module)."""

Held: TypeAlias = list[tuple[Sequence[Value], bytes]]
"""Held deletes: each deleted row's old key (its values, the key columns as the server sent
them) and its transaction's commit time as staged text."""


def delete_held(
    conn: Connection,
    plan: TablePlan,
    key: Sequence[int],
    held: Held,
    *,
    codec: str,
    soft_column: str | None,
    on_net: NetHook | None = None,
) -> None:
    """Applies the held deletes of ``plan``'s table by key, in one statement.

    Args:
        conn: The target session, in the target transaction.
        plan: The table's plan.
        key: The positions of the key's columns in the plan's columns (the server's order).
        held: The held deletes, in commit order.
        codec: The Python codec of the source's encoding (the keys' text is in it).
        soft_column: The soft-delete column under ``soft`` deletes, else None.
        on_net: The apply's :data:`~.net.NetHook`, called with the keys before the delete.
    """
    keys = TextKeys.from_arrays(
        [plan.written[i] for i in key],
        [[bytes(old[i]).decode(codec) for old, _ in held] for i in key],  # type: ignore[arg-type]
        alias="f",
    )
    if on_net is not None:
        on_net(conn, plan, keys.typed_rows(), keys.params)
    if soft_column is None:
        delete_keys(conn, plan.target, keys)
        return
    ensure_soft_column(conn, plan.target, soft_column)
    at = [bytes(at).decode() for _, at in held]  # each deleting transaction's commit time
    delete_keys(conn, plan.target, keys, soft=soft_column, at=at)
