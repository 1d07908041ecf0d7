"""The backfill's options: one frozen object, refused with ``plan_invalid`` when it is built, taken
whole by the engine."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dpone_dagster.backfill import Backfill, BackfillOptions, OnChanged
from dpone_dagster.lifecycle import DponeError
from dpone_dagster.postgres import ConnectionOptions
from tests.backfill.conftest import Pair


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ({"batch_size": 0}, "batch_size must be a whole number of at least 1, not 0."),
        ({"batch_size": "5000"}, "batch_size must be a whole number of at least 1, not '5000'."),
        ({"on_changed": "merge"}, "Unknown on_changed 'merge' (one of fail, repair)."),
        ({"settle_timeout": "soon"}, "BackfillOptions: settle_timeout: "),
        ({"colour": "red"}, "BackfillOptions: colour: "),
    ],
)
def test_an_invalid_option_is_plan_invalid_naming_it(values: dict[str, object], said: str) -> None:
    with pytest.raises(DponeError) as err:
        BackfillOptions.parse(values)
    assert err.value.code == "plan_invalid" and said in err.value.message
    assert err.value.next_actions


def test_the_options_are_frozen_and_parsed_once() -> None:
    options = BackfillOptions(batch_size=700, on_changed="repair")
    assert (options.batch_size, options.on_changed) == (700, OnChanged.REPAIR)
    with pytest.raises(ValidationError):
        options.batch_size = 800  # type: ignore[misc]
    assert options.replace(reconcile=False) == BackfillOptions(
        batch_size=700, on_changed="repair", reconcile=False
    )


def test_the_engine_refuses_the_session_options_its_options_name_took() -> None:
    with pytest.raises(TypeError, match="takes a BackfillOptions"):
        Backfill("host=a", "host=b", "public.mixed", cursor="id", options=ConnectionOptions())  # type: ignore[arg-type]


def test_the_run_follows_its_options_unless_told_otherwise(pair: Pair) -> None:
    options = BackfillOptions(batch_size=1000, reconcile=False, write_pause="ticket 7")
    backfill = pair.backfill(options)
    assert backfill.options is options and pair.backfill().options == BackfillOptions()
    result = backfill.run()
    assert result.reconciliation is None and result.committed == 5
    boundary = result.run.boundary
    assert boundary.kind == "bounded_write_pause"
    assert boundary.pause_reference == "ticket 7"  # type: ignore[union-attr]
    again = backfill.run(reconcile=True, reverify=True)
    assert again.reconciliation is not None and again.reconciliation.ok
