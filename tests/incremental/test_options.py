"""IncrementalOptions: the stream's options as one frozen object, refused where it is built with
the codes and messages of the parsers it reuses."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from dpone_dagster.core.deletes import Deletes
from dpone_dagster.core.errors import EngineError
from dpone_dagster.incremental import CheckScope, IncrementalOptions, Sweep
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres import SchemaChanges
from dpone_dagster.postgres.options import BatchSize


def test_text_becomes_the_typed_values_once() -> None:
    options = IncrementalOptions.parse(
        {"deletes": "sweep", "check": "full", "schema_changes": "freeze", "batch_size": 7,
         "lookback": 90, "sweep": None}
    )  # fmt: skip
    assert options.deletes is Deletes.SWEEP and options.check is CheckScope.FULL
    assert options.schema_changes is SchemaChanges.FREEZE
    assert isinstance(options.batch_size, BatchSize) and options.batch_size == 7
    assert options.lookback == timedelta(seconds=90)
    assert options.sweep == Sweep()  # None: the default budget, as the keyword took it


@pytest.mark.parametrize(
    ("values", "code", "message"),
    [
        ({"deletes": "all"}, "incremental_options_invalid", "Unknown deletes 'all'"),
        ({"batch_size": 0}, "incremental_options_invalid", "batch_size must be a whole number"),
        ({"check": "partial"}, "incremental_options_invalid", "Unknown check 'partial'"),
        ({"schema_changes": "thaw"}, "copy_options_invalid", "Unknown schema_changes 'thaw'"),
        ({"fillfactor": 90.5}, "incremental_options_invalid", "fillfactor=90.5."),
        ({"fillfactor": True}, "incremental_options_invalid", "fillfactor=True."),
        ({"lookback": timedelta(-1)}, "incremental_options_invalid", "lookback=-1 day"),
        ({"settle_timeout": -1}, "incremental_options_invalid", "settle_timeout=-1"),
        ({"soft_delete_column": ""}, "identifier_invalid", "soft-delete column name is empty"),
        ({"sweep": Sweep(rows=5), "repair": True, "reconcile": False},
         "incremental_options_invalid", "repair=True with reconcile=False"),
    ],
)  # fmt: skip
def test_a_bad_value_is_refused_with_its_parsers_code_and_message(
    values: dict[str, Any], code: str, message: str
) -> None:
    for build in (IncrementalOptions.parse, lambda v: IncrementalOptions(**v)):
        with pytest.raises(DponeError) as caught:
            build(values)
        assert caught.value.code == code, caught.value
        assert message in str(caught.value) and caught.value.next_actions


def test_a_wrong_type_is_the_streams_coded_error_naming_the_field() -> None:
    with pytest.raises(EngineError) as caught:
        IncrementalOptions.parse({"settle_timeout": "soon"})
    assert caught.value.code == "incremental_options_invalid"
    assert "settle_timeout" in str(caught.value)


def test_the_object_is_frozen_and_replace_validates_again() -> None:
    options = IncrementalOptions(deletes="hard")
    with pytest.raises(ValidationError):
        options.deletes = Deletes.SOFT  # type: ignore[misc]
    assert options.replace(batch_size=10).batch_size == 10
    assert options.deletes is Deletes.HARD  # the original is unchanged
    with pytest.raises(EngineError, match="repair=True with reconcile=False"):
        options.replace(reconcile=False, repair=True)


def test_the_engine_takes_the_object_and_refuses_the_session_options_its_name_took() -> None:
    from dpone_dagster.incremental import IncrementalSync
    from dpone_dagster.postgres import ConnectionOptions

    sync = IncrementalSync("host=a", "host=b", "shop.orders", cursor="updated_at")
    assert sync.options == IncrementalOptions() and sync.options.reconcile  # the asset's default
    with pytest.raises(TypeError, match="takes a IncrementalOptions"):
        IncrementalSync("host=a", "host=b", "shop.orders", cursor="updated_at",
                        options=ConnectionOptions())  # type: ignore[arg-type]  # fmt: skip
