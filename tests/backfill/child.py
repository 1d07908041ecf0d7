"""A backfill in its own process, for the crash and concurrency tests.

``python -m tests.backfill.child SOURCE_DSN TARGET_DSN BATCH_SIZE`` runs the backfill of
``public.mixed`` to the end. It prints one line per phase (``copy N``, ``commit N``,
``committed N`` or ``replayed N``), then ``done``, flushing each line so that the parent can
``kill -9`` it at a chosen moment. On a backfill error it prints ``error CODE`` and exits 3.
"""

from __future__ import annotations

import sys

from dpone_dagster.backfill import Backfill, BackfillError, BatchResult


def main() -> int:
    source, target, batch_size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    count = {"n": 0}

    def on_phase(phase: str) -> None:
        if phase == "copy":
            count["n"] += 1
        if phase != "committed":
            print(f"{phase} {count['n']}", flush=True)

    def on_batch(result: BatchResult) -> None:
        word = "replayed" if result.replayed else "committed"
        print(f"{word} {result.receipt.sequence}", flush=True)

    backfill = Backfill(
        source, target, "public.mixed", cursor="id", batch_size=batch_size, on_phase=on_phase
    )
    try:
        backfill.run(on_batch=on_batch)
    except BackfillError as exc:
        print(f"error {exc.code}", flush=True)
        return 3
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
