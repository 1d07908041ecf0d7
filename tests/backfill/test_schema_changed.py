"""The ordered backfill never evolves mid-run: a change of the source's copied columns stops it."""

from __future__ import annotations

import pytest

from dpone_dagster.backfill import Backfill, BackfillOptions, BackfillStatus
from dpone_dagster.core import EngineError
from tests.backfill.conftest import Pair
from tests.helpers import pg


def _backfill(pair: Pair) -> Backfill:
    return pair.backfill(BackfillOptions(batch_size=1000))


@pytest.mark.parametrize(
    ("ddl", "listed"),
    [
        ("ADD note text DEFAULT 'x'", "'note': absent -> text"),
        ("ALTER qty TYPE bigint", "'qty': integer -> bigint"),
        ("DROP blob", "'blob': bytea -> absent"),
    ],
)
def test_a_change_of_the_copied_columns_mid_run_stops_with_backfill_schema_changed(
    pair: Pair, ddl: str, listed: str
) -> None:
    with _backfill(pair) as backfill:
        batches = backfill.batches()
        next(batches)
        pg.execute(pair.source, f"ALTER TABLE mixed {ddl}")
        with pytest.raises(EngineError) as caught:
            next(batches)
        run = backfill.load()
    assert caught.value.code == "backfill_schema_changed"
    assert listed in caught.value.message and len(caught.value.next_actions) == 2
    assert run is not None and run.status is BackfillStatus.IN_PROGRESS
    assert run.progress.batch_count == 1  # the checkpoint did not move
    assert pg.fetch_one(pair.target, "SELECT count(*) FROM mixed") == 1000


def test_a_resume_under_other_columns_is_refused_and_restoring_them_resumes(pair: Pair) -> None:
    with _backfill(pair) as backfill:
        batches = backfill.batches()
        stopped_at = next(batches).run.progress.checkpoint
        pg.execute(pair.source, "ALTER TABLE mixed ADD note text DEFAULT 'x'")
        with pytest.raises(EngineError):
            next(batches)
    # The target takes the column too: a new run of the new columns would shadow the old one.
    pg.execute(pair.target, "ALTER TABLE mixed ADD note text DEFAULT 'x'")
    with _backfill(pair) as again, pytest.raises(EngineError) as caught:
        again.plan()
    assert caught.value.code == "backfill_schema_changed"
    assert f"stopped at checkpoint {stopped_at}" in caught.value.message
    assert "'note'" in caught.value.message
    # As docs/schema-changes.md says: restore the columns, and the run resumes after its checkpoint.
    pg.execute(pair.source, "ALTER TABLE mixed DROP note")
    pg.execute(pair.target, "ALTER TABLE mixed DROP note")
    with _backfill(pair) as resumed:
        result = resumed.run()
    assert result.run.status is BackfillStatus.SUCCEEDED
    assert result.run.progress.batch_count == 5 and result.run.progress.duplicate_count == 0
    source, target = pair.fingerprints()
    assert source == target
