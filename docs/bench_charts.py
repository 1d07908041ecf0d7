"""Draws the charts docs/benchmarks.md opens with, from the benchmarks' own result files.

- ``docs/img/bench_ratios.svg``: each path's median ratio to the raw ``psql | psql`` pipe (the
  copy engine, a warm and a cold ``dagster.materialize``, a backfill partition) at each size
  ``bench/results`` holds: every ``snapshot_copy*.json`` and ``backfill*.json``, by their
  ``table_rows`` (a new result file, at a new size, is a new bar).
- ``docs/img/bench_peers.svg``: ``bench/results/peers.json`` (``bench/peers.py``): each tool's
  rows per second with its ratio to the pipe, and its peak RSS.

``.venv/bin/python docs/benchmarks.py`` draws them with the page's tables; the SVG holds no date
and a fixed hash salt, so the same results draw the same file (``tests/test_docs.py`` checks that
the committed charts are the drawn ones). A ratio the benchmark refused (the pipe runs around it
spread too much) has no bar: the page says why under the chart (:func:`refusals`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
IMG = ROOT / "docs" / "img"
CHARTS = ("bench_ratios.svg", "bench_peers.svg")


@dataclass(frozen=True)
class Ratio:
    """One path's median ratio to the pipe at one size, or why there is none."""

    path: str
    rows: int
    ratio: float | None
    spread: str
    limit: str
    source: str


def _path(bench: str, name: str) -> str | None:
    """The chart's name of a result row, or None for a row that is not a ratio to the pipe."""
    if bench == "backfill":
        for start, path in (
            ("backfill batches", "backfill: engine, batches"),
            ("to done", "backfill: engine, to done (+ reconciliation)"),
            ("dagster.materialize", "backfill partition: warm dagster.materialize"),
            ("cold process", "backfill partition: cold run worker"),
        ):
            if name.startswith(start):
                return path
        return None
    strategy = re.sub(r" \(.*?\)| \+ check.*", "", name)
    if strategy.startswith("dagster:"):
        return f"snapshot copy: warm dagster.materialize, {strategy[8:]}"
    if strategy.startswith("cold process: materialize "):
        return f"snapshot copy: cold run worker, {strategy.split()[-1]}"
    return f"snapshot copy: engine, {strategy}"


def ratios() -> list[Ratio]:
    """Every ratio to the pipe of every snapshot-copy and backfill result file."""
    found: list[Ratio] = []
    files = sorted(RESULTS.glob("snapshot_copy*.json")) + sorted(RESULTS.glob("backfill*.json"))
    for file in files:
        result: dict[str, Any] = json.loads(file.read_text())
        for row in result["rows"]:
            name = row.get("strategy") or row["measure"]
            path = _path(result["bench"], name)
            median = row.get("ratio_median", row.get("median"))
            if path is None or not row.get("pipe_spread"):
                continue
            value = None if median == "refused" else float(median)
            limit = result.get("max_spread", "15%")
            found.append(Ratio(path, int(result["table_rows"]), value, row["pipe_spread"], limit,
                               file.name))  # fmt: skip
    return found


def _size(rows: int) -> str:
    return f"{rows / 1e6:g}M rows" if rows >= 1_000_000 else f"{rows:,} rows"


def refusals() -> list[str]:
    """One line per refused ratio of the ratios chart: which, and why."""
    return [
        f"- {r.path}, {_size(r.rows)} (`bench/results/{r.source}`): refused, the raw pipe runs "
        f"around it spread {r.spread} (over {r.limit}): the machine's speed changed under it."
        for r in ratios()
        if r.ratio is None
    ]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams.update({"svg.hashsalt": "dpone", "font.size": 9})
    import matplotlib.pyplot as plt

    return plt


def draw_ratios(path: Path) -> None:
    """The ratios chart: a row per path, a bar per size, the pipe at 1.0."""
    plt = _pyplot()
    from matplotlib.patches import Patch

    found = ratios()
    paths = list(dict.fromkeys(r.path for r in found))[::-1]
    sizes = sorted({r.rows for r in found})
    height = 0.8 / len(sizes)
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(paths) * len(sizes) ** 0.5 + 1.6))
    for i, size in enumerate(sizes):
        for r in (r for r in found if r.rows == size):
            y = paths.index(r.path) - (i - (len(sizes) - 1) / 2) * height
            if r.ratio is None:
                ax.text(0.01, y, f"{_size(size)}: refused", va="center", fontsize=7, color="grey")
                continue
            ax.barh(y, r.ratio, height, color=f"C{i}")
            ax.text(r.ratio + 0.01, y, f"{r.ratio:.2f}", va="center", fontsize=7)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax.text(0.99, -0.45, "the raw psql | psql pipe = 1.0", fontsize=8, va="center", ha="right")
    ax.set_yticks(range(len(paths)), paths)
    ax.set_ylim(-0.7, len(paths) - 0.4)
    ax.set_xlabel("median ratio to the raw pipe timed around it (higher is faster)")
    patches = [Patch(color=f"C{i}", label=_size(size)) for i, size in enumerate(sizes)]
    ax.legend(handles=patches, loc="center right")
    ax.set_xlim(0, 1.3)
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


def draw_peers(path: Path) -> None:
    """The peers chart: rows per second (with the ratio to the pipe) and peak RSS per tool."""
    plt = _pyplot()
    result: dict[str, Any] = json.loads((RESULTS / "peers.json").read_text())
    rows = result["rows"][::-1]
    names = [r["tool"] + ("" if r["all_16_columns"] == "yes" else " *") for r in rows]
    fig, (speed, memory) = plt.subplots(
        1, 2, figsize=(9, 0.5 * len(rows) + 1.4), sharey=True, width_ratios=[3, 2]
    )
    for y, r in enumerate(rows):
        speed.barh(y, r["rows_per_second"], color="C0" if "dpone" not in r["tool"] else "C1")
        said = (f" {r['ratio_to_pipe']} of the pipe" if r["ratio_to_pipe"] != "refused" else
                f" ratio refused: the pipe spread {r['pipe_spread']} around it")  # fmt: skip
        speed.text(r["rows_per_second"], y, said, va="center", fontsize=7)
        memory.barh(y, r["peak_rss_mb"], color="C2")
        memory.text(r["peak_rss_mb"], y, f" {r['peak_rss_mb']}", va="center", fontsize=7)
    speed.set_yticks(range(len(rows)), names)
    speed.xaxis.set_major_formatter(lambda value, _: f"{value / 1000:g}k")
    speed.set_xlabel(f"rows per second, {result['table_rows']:,} rows (higher is faster)")
    speed.set_xlim(0, max(r["rows_per_second"] for r in rows) * 1.35)
    memory.set_xlabel("peak RSS of the process tree, MB")
    memory.set_xlim(0, max(r["peak_rss_mb"] for r in rows) * 1.25)
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


def draw(into: Path = IMG) -> list[Path]:
    """Draws both charts into ``into``; their paths."""
    into.mkdir(parents=True, exist_ok=True)
    draw_ratios(into / CHARTS[0])
    draw_peers(into / CHARTS[1])
    return [into / name for name in CHARTS]


if __name__ == "__main__":
    for drawn in draw():
        print(drawn.relative_to(ROOT))
