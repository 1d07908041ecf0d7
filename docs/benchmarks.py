"""Renders the figures of docs/benchmarks.md from the benchmarks' own output.

Each benchmark with ``--json bench/results/NAME.json`` writes its result table, the command, the
date and the machine (cores, RAM, PostgreSQL version, load average at its start and end). This
script rewrites every block ``<!-- bench: NAME -->`` ... ``<!-- /bench: NAME -->`` of the page
(and of the job pages of :data:`OTHER_PAGES`) from ``bench/results/NAME.json``: a line saying
when, how and on what it ran, then the table. The block ``<!-- bench-charts -->`` the page
opens with shows the charts ``docs/bench_charts.py`` draws from the same files, and one line
for each ratio a chart leaves out because the benchmark refused it. Run
``.venv/bin/python docs/benchmarks.py`` after committing a new result file: it rewrites the
blocks and draws the charts; ``tests/test_docs.py`` fails while a block or a chart is not the
generated one.
"""

import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_charts

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "benchmarks.md"
OTHER_PAGES = (ROOT / "docs" / "replication.md",)
"""Job pages that show a benchmark's block too (the same rendering, from the same file)."""
RESULTS = ROOT / "bench" / "results"
_BLOCK = re.compile(r"<!-- bench: (\w+) -->\n.*?<!-- /bench: \1 -->", re.DOTALL)
_CHARTS = re.compile(r"<!-- bench-charts -->\n.*?<!-- /bench-charts -->", re.DOTALL)
_LOADED = 1.0
"""A load average per core above this at a benchmark's start (more runnable work than cores) is a
loaded machine, and the line says so. The start is what other work put on the machine; the end
also counts the benchmark's own sessions (a copy keeps both cores busy), so it is printed but
does not decide. A result whose ``machine.shared`` says what else ran (written into the file by
whoever ran it, when other work began after the benchmark's start) is printed as shared."""


def _machine(m: dict[str, Any]) -> str:
    start, end = m["load_average"], m["load_average_end"]
    busy = start[0] / max(m["cores"], 1) > _LOADED
    state = "loaded: other work shared it" if busy else "quiet: nothing else ran"
    if m.get("shared"):  # other work began after the start, which its load average cannot see
        state = f"shared: {m['shared']}"
    return (
        f"the {m['cores']}-core machine ({m['ram_gb']:g} GB RAM), PostgreSQL {m['postgresql']}; "
        f"load average {start[0]:g} at the start ({state}), {end[0]:g} at the end (the "
        "benchmark's own work included)"
    )


def render(name: str, result: dict[str, Any]) -> str:
    """The block of ``bench/results/NAME.json``: its provenance line and its table."""
    rows: list[dict[str, Any]] = result["rows"]
    columns = list(rows[0])
    facts = {
        k: v for k, v in result.items() if k not in ("bench", "date", "command", "machine", "rows")
    }
    lines = [
        f"<!-- bench: {name} -->",
        f"Measured on {result['date']} with `{result['command']}` on {_machine(result['machine'])}."
        + (
            " " + "; ".join(f"{k.replace('_', ' ')}: {v}" for k, v in facts.items()) + "."
            if facts
            else ""
        ),
        "",
        "| " + " | ".join(c.replace("_", " ") for c in columns) + " |",
        "| " + " | ".join("---" for _ in columns) + " |",
        *(
            "| " + " | ".join("" if row[c] is None else f"{row[c]}" for c in columns) + " |"
            for row in rows
        ),
        f"<!-- /bench: {name} -->",
    ]
    return "\n".join(lines)


def charts() -> str:
    """The charts block: both charts, and why each ratio a chart leaves out was refused."""
    refused = bench_charts.refusals()
    peers = json.loads((RESULTS / "peers.json").read_text())
    lines = [
        "<!-- bench-charts -->",
        "![Each path's median ratio to the raw psql | psql pipe timed around it, by table size]"
        "(img/bench_ratios.svg)",
        "",
        "Drawn by `.venv/bin/python docs/benchmarks.py` from `bench/results/snapshot_copy*.json`"
        " and `backfill*.json`. Ratios the chart leaves out, because the benchmark refused them:",
        "",
        *(refused or ["- none"]),
        "",
        "![The peers on one table, side by side in one run: rows per second and peak RSS]"
        "(img/bench_peers.svg)",
        "",
        f"From `bench/results/peers.json` (`bench/peers.py`, {peers['table_rows']:,} rows, "
        f"{peers['date']}; see [the peers](#the-peers-on-one-table)); `*`: the tool could not "
        "copy all 16 columns of the mixed table, so every tool copied it without "
        f"{' and '.join(peers['columns_left_out'])}.",
        "<!-- /bench-charts -->",
    ]
    return "\n".join(lines)


def generated(text: str) -> str:
    """The page with every bench block rendered from its result file, and the charts block."""

    def block(match: re.Match[str]) -> str:
        name = match.group(1)
        return render(name, json.loads((RESULTS / f"{name}.json").read_text()))

    return _CHARTS.sub(lambda _: charts(), _BLOCK.sub(block, text))


def main() -> None:
    text = PAGE.read_text()
    assert _BLOCK.search(text), "docs/benchmarks.md has no <!-- bench: NAME --> block"
    assert _CHARTS.search(text), "docs/benchmarks.md has no <!-- bench-charts --> block"
    PAGE.write_text(generated(text))
    for page in OTHER_PAGES:
        page.write_text(generated(page.read_text()))
    for drawn in bench_charts.draw():
        print(drawn.relative_to(ROOT))


if __name__ == "__main__":
    main()
