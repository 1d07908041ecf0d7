"""A stream's COMMIT whose answer is lost, for real (a proxy drops the target's socket): the run
waits the old session out and continues from the durable state, with each row copied once."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dpone_dagster.incremental import IncrementalResult
from tests.helpers import pg
from tests.helpers.proxy import TcpProxy
from tests.incremental.conftest import Stream


def _run_cutting(stream: Stream, cut: Callable[[TcpProxy], None]) -> tuple[IncrementalResult, int]:
    """One run of the stream (1,000-row batches over 2,500 rows: three batches) through a proxy
    on the target that ``cut`` breaks at the second batch's COMMIT; the result and how many
    COMMITs the stream sent."""
    proxy = TcpProxy.to(stream.target)
    commits = {"n": 0}

    def on_phase(phase: str) -> None:
        if phase == "commit":
            commits["n"] += 1
            if commits["n"] == 2:
                cut(proxy)

    try:
        sync = stream.sync(on_phase=on_phase)
        sync.target_dsn = proxy.dsn(stream.target)
        result = sync.run()
    finally:
        proxy.close()
    return result, commits["n"]


def _receipts(stream: Stream) -> list[tuple[int, int]]:
    return [
        (int(str(r[0])), int(str(r[1])))
        for r in pg.fetch_all(
            stream.target,
            "SELECT sequence, (receipt_json->>'rows')::int"
            " FROM dpone_ledger.incremental_batch_receipts ORDER BY sequence",
        )
    ]


@pytest.mark.parametrize(
    ("how", "committed"),
    [
        # The COMMIT reaches the server, its answer never reaches the stream.
        pytest.param(lambda p: p.cut_after_client_message(), True, id="commit-landed"),
        # The socket is gone before the COMMIT is sent: the server rolls the batch back.
        pytest.param(lambda p: p.cut_all(), False, id="commit-lost"),
    ],
)
def test_a_lost_commit_answer_is_waited_out_and_the_run_continues_from_the_ledger(
    stream: Stream, how: Callable[[TcpProxy], None], committed: bool
) -> None:
    result, commits = _run_cutting(stream, how)
    # A second COMMIT of the second batch only when the first did not land.
    assert commits == (3 if committed else 4)
    stream.assert_equal()
    # Three batches in the ledger whichever way the COMMIT went: the landed batch is not copied
    # again, the lost one is copied once more, and the run's report reads the ledger.
    assert _receipts(stream) == [(1, 1000), (2, 1000), (3, 500)]
    assert (result.inserted, result.batches, result.resumed) == (2500, 3, False)
    assert result.batches_here == (2 if committed else 3)
    assert result.target_rows == 2500
    state = pg.fetch_one(
        stream.target, "SELECT state_json->>'run' IS NULL FROM dpone_ledger.incremental_streams"
    )
    assert state is True
