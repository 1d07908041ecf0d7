"""The incremental demo: one change, one late commit and one delete arriving in ``shop.stock``.

Run ``python -m demo.stream`` from the repository root after ``python -m demo.seed``; it drives
the ``shop/stock`` asset of ``definitions.py`` with the dagster CLI, as its schedule would:

1. the first materialization is the initial load;
2. a row changes (``qty``), a row is deleted, and a writer opens a transaction that sets another
   row's ``updated_at = now()`` and keeps it open while a second change commits after it;
3. the second materialization takes its mark above the open writer's timestamp, waits for it
   (``settle_timeout``), and goes ahead without it (``incremental_mark_unsettled``);
4. the writer commits: its row is now a late commit, below the mark the stream has passed;
5. the third materialization copies it, because the stream read again from below the writer.

It prints what arrived after each run.
"""

from __future__ import annotations

import sys

import psycopg

from demo.seed import choose
from demo.story import materialize, say


def qty(dsn: str, key: int) -> object:
    """The row's ``qty`` (``None`` when the row is not there)."""
    with psycopg.connect(dsn) as conn:
        found = conn.execute("SELECT qty FROM shop.stock WHERE id = %s", (key,)).fetchone()
    return None if found is None else found[0]


def stream_mark(target: str) -> str:
    """The stream's mark, from its state in the ledger."""
    with psycopg.connect(target) as conn:
        found = conn.execute(
            "SELECT state_json->>'mark' FROM dpone_ledger.incremental_streams"
        ).fetchone()
    return str(found[0]) if found else "?"


def main() -> int:
    """Runs the story and says, for each change, what the target holds."""
    source, target = choose("source").dsn, choose("target").dsn
    materialize("shop/stock")
    with psycopg.connect(target) as conn:
        found = conn.execute("SELECT count(*) FROM shop.stock").fetchone()
    say("stream run 1", f"initial load of shop.stock: {found[0] if found else 0} rows",
        "the stream's mark is in the ledger, in the target")  # fmt: skip
    with psycopg.connect(source, autocommit=True) as conn:
        conn.execute("UPDATE shop.stock SET qty = 999, updated_at = now() WHERE id = 7")
        conn.execute("DELETE FROM shop.stock WHERE id = 13")
    late = psycopg.connect(source)  # a writer whose transaction stays open
    late.execute("UPDATE shop.stock SET qty = 555, updated_at = now() WHERE id = 21")
    with psycopg.connect(source, autocommit=True) as conn:
        conn.execute("UPDATE shop.stock SET qty = 111, updated_at = now() WHERE id = 22")
    materialize("shop/stock")  # waits settle_timeout (2 s) for the open writer, then goes on
    mark = stream_mark(target)
    gone = "gone from" if qty(target, 13) is None else "STILL IN"
    say("stream run 2", f"change: id 7 has qty {qty(target, 7)} in the target; "
        f"delete: id 13 is {gone} the target",
        "changes and hard deletes arrive, each batch checkpointed")  # fmt: skip
    say("  open writer", f"id 21 has qty {qty(target, 21)} in the target (its writer is open)",
        "the run waited 2 s for it, then went on without it")  # fmt: skip
    late.commit()
    late.close()
    with psycopg.connect(source) as conn:
        found = conn.execute(
            "SELECT updated_at <= %s::timestamptz FROM shop.stock WHERE id = 21", (mark,)
        ).fetchone()
    assert found is not None
    below = "below" if found[0] else "above"
    materialize("shop/stock")
    say("stream run 3", f"late commit: id 21 committed {below} the mark; "
        f"late: id 21 has qty {qty(target, 21)} in the target",
        "the stream read again from below the open writer: no late row is lost")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
