"""What ``bench/backfill.py`` prints and writes: each round's line, the summary over the rounds
(best and median, each ratio beside the raw pipe's seconds and spread, ``refused`` past the
spread limit) as printed and as the result table (``--json``), and where a batch's time goes."""

from __future__ import annotations

import statistics
from typing import Any

from bench import pipe


def print_round(n: int, r: dict[str, Any], rows: int) -> None:
    """The round's line."""
    stats, (early, late) = r["stats"], r["cp_at"]
    print(
        f"round {n}: raw pipe {r['raw']:5.2f} s {rows / r['raw']:9,.0f} rows/s | batches "
        f"{r['copy']:5.2f} s {r['batches_ratio']:.2f} | reconciliation {r['reconcile']:5.2f} s ("
        f"{stats['proven']}/{stats['ranges']} ranges by row versions; all hashed "
        f"{stats['hash_seconds']:.2f} s) | to done {r['copy'] + r['reconcile']:5.2f} s "
        f"{r['done_ratio']:.2f} | dagster.materialize + check {r['dagster']:5.2f} s "
        f"{r['dagster_ratio']:.2f} | cold process {r['cold']:5.2f} s {r['cold_ratio']:.2f} | "
        f"checkpoint at {early:,} {r['cp_early']:.3f} ms, at {late:,} {r['cp_late']:.3f} ms "
        f"({r['cp_ratio']:.2f}) | RSS {r['rss']:.0f} MB",
        flush=True,
    )


def phase_lines(rounds: list[dict[str, Any]]) -> list[str]:
    """Where a batch's time goes (medians over the rounds, per batch), beyond the relay."""
    stats = [r["stats"] for r in rounds]
    batches = stats[0]["batches"]

    def per_batch(values: list[float]) -> str:
        return f"{statistics.median(values) / batches * 1000:7.1f} ms"

    copy = statistics.median(r["copy"] for r in rounds)
    lines = [f"per batch ({batches} batches; the plan once: "
             f"{statistics.median(s['plan_seconds'] for s in stats):.2f} s):"]  # fmt: skip
    labels = {
        "before copy": "before the copy (run lock, ledger reads, snapshot, bounds, columns)",
        "copy": "the copy (relay, content hash, target count, evidence, receipt written)",
        "commit": "the commit (COMMIT)",
    }
    for phase, label in labels.items():
        values = [s["phases"][phase] for s in stats]
        share = statistics.median(values) / copy
        lines.append(f"  {label:<72} {per_batch(values)}  {share:4.0%} of the batches")
    hashed = [s["content_hash_seconds"] for s in stats]
    lines.append(
        f"  {'  of the copy: SHA-256 of its bytes (the receipt content hash)':<72} "
        f"{per_batch(hashed)}  {statistics.median(hashed) / copy:4.0%} of the batches"
    )
    return lines


class Summary:
    """The rounds' figures, best and median (best: the highest ratio, the lowest time), as
    printed and as the result table's rows (``--json``)."""

    def __init__(self, rounds: list[dict[str, Any]], rows: int, limit: float) -> None:
        self.rounds, self.rows, self.limit = rounds, rows, limit

    def col(self, key: str) -> list[float]:
        """One figure over the rounds."""
        return [r[key] for r in self.rounds]

    def pipes(self, path: str) -> list[float]:
        """The raw-pipe runs around ``path`` over the rounds."""
        return [p for r in self.rounds for p in r["pipes"][path]]

    def ratio(self, key: str, path: str, target: str = "") -> dict[str, str]:
        """A ratio's row cells: best, median (``refused`` past the spread limit), the pipe's
        seconds and spread."""
        values, pipes = self.col(key), self.pipes(path)
        seconds, spread = pipe.pipe_cells(pipes)
        return {"best": pipe.ratio_cell(max(values), pipes, self.limit),
                "median": pipe.ratio_cell(statistics.median(values), pipes, self.limit),
                "target": target, "pipe_seconds": seconds, "pipe_spread": spread}  # fmt: skip

    def seconds(self, key: str) -> dict[str, str]:
        """A time's row cells."""
        values = self.col(key)
        return {"best": f"{min(values):.2f} s", "median": f"{statistics.median(values):.2f} s",
                "target": "", "pipe_seconds": "", "pipe_spread": ""}  # fmt: skip

    def table(self, seed_rate: float) -> list[dict[str, Any]]:
        """The result table's rows (``seed_rate``: the seed's rows/s)."""
        rates = [self.rows / r for r in self.col("raw")]
        seed_share = seed_rate / statistics.median(rates)
        blank = {"target": "", "pipe_seconds": "", "pipe_spread": ""}
        return [
            {"measure": "raw binary COPY pipe (rows/s)", "best": f"{max(rates):,.0f}",
             "median": f"{statistics.median(rates):,.0f}", **blank},
            {"measure": "backfill batches, of the raw pipe's rows/s",
             **self.ratio("batches_ratio", "backfill")},
            {"measure": "final reconciliation", **self.seconds("reconcile")},
            {"measure": "the same, every range hashed", **self.seconds("hash_all")},
            {"measure": "to done (batches + reconciliation)",
             **self.ratio("done_ratio", "backfill", "0.70")},
            {"measure": "dagster.materialize of the asset + check (warm; batches by width)",
             **self.ratio("dagster_ratio", "dagster", "0.75")},
            {"measure": "cold process: Definitions + materialize + check",
             **self.ratio("cold_ratio", "cold", "0.85")},
            {"measure": "one checkpoint early / late (ms)",
             "best": f"{statistics.median(self.col('cp_early')):.3f} / "
                     f"{statistics.median(self.col('cp_late')):.3f}",
             "median": f"ratio {statistics.median(self.col('cp_ratio')):.2f}", **blank},
            {"measure": "client peak RSS; the Dagster process; the cold process (MB)",
             "best": f"{max(self.col('rss')):.0f}; {max(self.col('dagster_rss')):.0f}; "
                     f"{max(self.col('cold_rss')):.0f}", "median": "", **blank},
            {"measure": "seed row-by-row, of the raw pipe", "best": f"{seed_share:.3f}",
             "median": "", **blank},
        ]  # fmt: skip

    def lines(self, seed_rate: float) -> list[str]:
        """The printed summary (the table's rows, one a line)."""
        rows = self.table(seed_rate)
        out = []
        for row in rows:
            beside = f"  pipe {row['pipe_seconds']} s, spread {row['pipe_spread']}"
            target = f"  (target {row['target']})" if row["target"] else ""
            median = f"  median {row['median']}" if row["median"] else ""
            out.append(
                f"{row['measure']:<62} best {row['best']}{median}{target}"
                + (beside if row["pipe_seconds"] else "")
            )
        return out


def phase_ms(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """Milliseconds per batch of each phase (medians over the rounds), for the result file."""
    stats = [r["stats"] for r in rounds]
    batches = stats[0]["batches"]
    phases = {k: [s["phases"][k] for s in stats] for k in stats[0]["phases"]}
    phases["content hash alone"] = [s["content_hash_seconds"] for s in stats]
    return {k: round(statistics.median(v) / batches * 1000, 1) for k, v in phases.items()}
