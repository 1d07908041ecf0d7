"""Each closed vocabulary is one type: a spelling becomes a member once, a member passes every
later parse unchanged, and an unknown spelling is refused with the owner's code and error type."""

from __future__ import annotations

import pytest

from dpone_dagster.backfill import OnChanged
from dpone_dagster.core import EngineError
from dpone_dagster.core.deletes import Deletes
from dpone_dagster.lifecycle import DponeError, Vocabulary
from dpone_dagster.postgres import BatchSize, CopyPlanError, SchemaChanges, Sink
from dpone_dagster.postgres.schema_change import SchemaChangeError
from dpone_dagster.snapshot_copy import Strategy

VOCABULARIES: list[tuple[type[Vocabulary], type[DponeError], str]] = [
    (Strategy, CopyPlanError, "copy_options_invalid"),
    (Sink, CopyPlanError, "copy_options_invalid"),
    (SchemaChanges, SchemaChangeError, "copy_options_invalid"),
    (OnChanged, EngineError, "plan_invalid"),
    (Deletes, EngineError, "incremental_options_invalid"),
]


@pytest.mark.parametrize(("vocabulary", "error", "code"), VOCABULARIES)
def test_a_spelling_becomes_its_member_and_a_member_passes_unchanged(
    vocabulary: type[Vocabulary], error: type[DponeError], code: str
) -> None:
    for member in vocabulary:
        parsed = vocabulary.parse(member.value)
        assert parsed is member and parsed == member.value
        assert vocabulary.parse(member) is member


@pytest.mark.parametrize(("vocabulary", "error", "code"), VOCABULARIES)
def test_an_unknown_spelling_is_refused_with_the_owners_code_listing_the_choices(
    vocabulary: type[Vocabulary], error: type[DponeError], code: str
) -> None:
    for bad in ("Merge ", "", None, 3):
        with pytest.raises(error) as caught:
            vocabulary.parse(bad)
        assert caught.value.code == code
        assert vocabulary.option in caught.value.message
        for member in vocabulary:
            assert member.value in caught.value.message
            assert member.value in caught.value.next_actions[0]


def test_a_batch_size_is_a_whole_number_of_at_least_one_parsed_once() -> None:
    size = BatchSize.parse(500, refusal="plan_invalid")
    assert size == 500 and isinstance(size, BatchSize)
    assert BatchSize.parse(size, refusal="plan_invalid") is size
    for bad in (0, -1, 2.5, True, "100"):
        with pytest.raises(DponeError) as caught:
            BatchSize.parse(bad, refusal="incremental_options_invalid")
        assert caught.value.code == "incremental_options_invalid"
        assert "batch_size" in caught.value.message
