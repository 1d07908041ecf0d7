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

import os
import subprocess
import sys

import psycopg

from demo.seed import choose

SELECT = ["--select", "shop/stock"]


def materialize(label: str) -> None:
    """One materialization of ``shop/stock`` through the dagster CLI."""
    bin_dir = os.path.dirname(sys.executable)
    subprocess.run(
        [os.path.join(bin_dir, "dagster"), "asset", "materialize", "-f", "definitions.py",
         *SELECT],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    print(f"{label}: materialized shop/stock")


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
    """Runs the story and prints, for each change, what the target holds."""
    source, target = choose("source").dsn, choose("target").dsn
    materialize("run 1 (initial load)")
    with psycopg.connect(source, autocommit=True) as conn:
        conn.execute("UPDATE shop.stock SET qty = 999, updated_at = now() WHERE id = 7")
        conn.execute("DELETE FROM shop.stock WHERE id = 13")
    late = psycopg.connect(source)  # a writer whose transaction stays open
    late.execute("UPDATE shop.stock SET qty = 555, updated_at = now() WHERE id = 21")
    with psycopg.connect(source, autocommit=True) as conn:
        conn.execute("UPDATE shop.stock SET qty = 111, updated_at = now() WHERE id = 22")
    materialize("run 2 (a writer is still open)")
    mark = stream_mark(target)
    print(f"  mark after run 2: {mark}")
    print(f"  change: id 7 has qty {qty(target, 7)} in the target")
    print(f"  delete: id 13 is {'gone from' if qty(target, 13) is None else 'STILL IN'} the target")
    print(f"  open:   id 21 has qty {qty(target, 21)} in the target (its writer is open)")
    late.commit()
    late.close()
    with psycopg.connect(source) as conn:
        found = conn.execute(
            "SELECT updated_at::text, updated_at <= %s::timestamptz FROM shop.stock WHERE id = 21",
            (mark,),
        ).fetchone()
    assert found is not None
    below = "below" if found[1] else "above"
    print(f"late commit: id 21 committed now, updated_at {found[0]}, {below} the mark")
    materialize("run 3")
    print(f"  late:   id 21 has qty {qty(target, 21)} in the target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
