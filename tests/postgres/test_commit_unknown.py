"""A lost COMMIT acknowledgement, produced for real: ``retain_commit_unknown``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dpone_dagster.snapshot_copy import CopyError, CopyOptions, copy_tables
from tests.helpers import pg
from tests.helpers.proxy import TcpProxy, is_commit


@pytest.fixture
def proxy(target_dsn: str) -> Iterator[TcpProxy]:
    proxy = TcpProxy.to(target_dsn)
    yield proxy
    proxy.close()


@pytest.mark.cross_server
@pytest.mark.parametrize("strategy", ["whole_copy", "stream_rows"])
def test_a_lost_commit_acknowledgement_retains_the_files_and_closes_the_source(
    source_dsn: str, target_dsn: str, proxy: TcpProxy, tmp_path: Path, strategy: str
) -> None:
    pg.create_mixed_table(source_dsn, rows=500)
    proxy.cut_after_client_message(is_commit)
    with pytest.raises(CopyError) as err:
        copy_tables(
            source_dsn,
            proxy.dsn(target_dsn),
            ["public.mixed"],
            strategy=strategy,  # type: ignore[arg-type]
            tuning=CopyOptions(spool_dir=tmp_path),
        )
    assert proxy.cut_events == 1
    assert err.value.code == "target_commit_unknown"
    report = err.value.report
    assert report is not None and report.outcome == "retain_commit_unknown"
    terminal = report.tables[0].terminal_receipt
    assert terminal is not None and terminal.outcome == "retain_commit_unknown"
    assert terminal.released_files == ()
    if strategy == "whole_copy":
        # The file is evidence of what was sent: kept, whole, and listed.
        assert len(terminal.retained_files) == 1
        kept = Path(terminal.retained_files[0])
        assert kept.parent == tmp_path
        assert kept.stat().st_size == report.tables[0].extraction_receipt.byte_count  # type: ignore[union-attr]
        assert terminal.source_action == "none", "its read-only transaction committed earlier"
    else:
        # A live cursor and its read-only transaction are never evidence.
        assert terminal.source_action == "rollback" and terminal.sources_closed
    # Nothing stays open. The target's session may still be finishing the COMMIT the proxy
    # forwarded before it cut the answer (the ambiguity itself): it is waited for, not raced.
    pg.wait_for_no_open_transaction(source_dsn, target_dsn, timeout=30)
    # The ambiguity was real: the server did commit, only the answer was lost.
    assert pg.table_fingerprint(source_dsn, "public", "mixed") == pg.table_fingerprint(
        target_dsn, "public", "mixed"
    )
    assert (
        pg.fetch_all(
            target_dsn, r"SELECT relname FROM pg_class WHERE relname LIKE '\_dpone\_stg\_%%'"
        )
        == []
    )
