"""Benchmark: the tools a user would pick for one PostgreSQL table, side by side in one run.

Copies the same table (the benchmarks' mixed table, 1,000,000 rows by default) from a source
database into a fresh target database per tool, each tool as a whole process timed from its
start to its exit:

- the raw binary ``psql | psql`` COPY pipe (``bench/pipe.py``), the yardstick of every benchmark,
  into a target table that has its primary key;
- dpone: a cold run worker, a fresh ``python`` that imports Dagster and the package, builds the
  ``Definitions`` of ``snapshot_copy_assets(["public.mixed"])`` (``batched_copy``, sink
  ``replace``) and materializes it with its ``dpone_reconciled`` check (``bench/snapshot_copy.py``'s
  ``cold:`` run);
- pgcopydb ``copy table-data`` (Debian's ``pgcopydb``: ``apt-get install -y pgcopydb``), into a
  target table that has its primary key; left out, and said so, when it is not installed;
- Sling: its CLI (the binary of PyPI's ``sling-linux-amd64``; the ``sling`` package downloads
  its binary from outside the package index at first use), ``--mode full-refresh``, which creates
  its table;
- dlt: ``sql_table`` with the ``pyarrow`` backend into the ``postgres`` destination,
  ``write_disposition="replace"`` (``bench/peers_dlt.py``), which creates its table.

Sling and dlt are installed from the package index into the peers' own virtualenv
(``.venv-peers``, made on the first run; ``--peers-venv``), never into the project's.

Each tool's run is bracketed by raw-pipe runs and its ratio is the pipe's mean time around it
over the tool's time (1.0 is as fast as the pipe; ``refused`` when those pipe runs spread over
15%, as in the other benchmarks). Its peak RSS is the sum of the peak (``VmHWM``) of each
process of the tool's process tree, read from ``/proc`` every 20 ms. After each tool, its target
is verified equal to the source: the same row count and, column by column, the same values in
``id`` order (each target column cast to the source column's type, or both as JSON where the
tool stored an array as JSON), by an md5 per column computed by each server.

The 16-column table has two types the peers refuse: Sling's bulk load fails on the ``bytea``
column (its rows reach ``COPY`` as invalid UTF-8) and dlt's ``pyarrow`` backend refuses the
``interval`` column. So the run first copies a 20,000-row table of all 16 columns with each tool
and records whether it could (``all 16 columns``), then times every tool on the table without
those two columns (14 columns), the same table for all.

Run from the repository root::

    .venv/bin/python bench/peers.py                  # 1M rows
    .venv/bin/python bench/peers.py --rows 20000     # a smoke run
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from psycopg import conninfo, sql  # noqa: E402

from bench import pipe, result_file  # noqa: E402
from bench.peers_check import columns, verify  # noqa: E402
from bench.process_tree import measured  # noqa: E402
from tests.helpers import pg  # noqa: E402

PEERS_PACKAGES = (
    "sling-linux-amd64==1.4.11",
    "dlt[postgres,sql-database]==1.31.0",
    "pyarrow==26.0.1",
)
"""What the peers' virtualenv holds, pinned: the result names these versions."""
REFUSED_COLUMNS = {
    "blob": "bytea: Sling's bulk load sends its bytes to COPY as invalid UTF-8",
    "span": "interval: dlt's pyarrow backend refuses duration[us]",
}
"""The mixed table's columns left out of the timed table, and which peer refuses each."""
PROBE_ROWS = 20_000
"""Rows of the 16-column table each tool first copies (Sling's bulk load copies a few thousand
rows of ``bytea`` before the first invalid byte meets ``COPY``)."""


def peers_venv(path: Path) -> Path:
    """The peers' virtualenv at ``path``, made and filled from the package index if missing."""
    python = path / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *PEERS_PACKAGES], check=True
        )  # fmt: skip
    return path


def sling_binary(venv: Path) -> Path:
    """The Sling binary PyPI's ``sling-linux-amd64`` ships."""
    [found] = venv.glob("lib/python*/site-packages/sling_linux_amd64/bin/sling-linux-amd64")
    found.chmod(0o755)
    return found


def url(dsn: str, scheme: str = "postgresql", password: str | None = None) -> str:
    """A libpq DSN as a URL (what Sling, dlt and pgcopydb take); ``password`` for a tool that
    refuses a URL without one (dlt), where the server does not ask for it."""
    p = conninfo.conninfo_to_dict(dsn)
    secret = p.get("password") or password
    user = str(p.get("user") or "postgres") + (f":{secret}" if secret else "")
    host, port = p.get("host") or "127.0.0.1", p.get("port") or 5432
    return f"{scheme}://{user}@{host}:{port}/{p['dbname']}"


def _version(argv: Sequence[str]) -> str:
    """The first version number ``argv`` prints (``1.4.11``, ``0.10-1``, ``15.20``)."""
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    found = re.search(r"\d+\.\d+[\w.+-]*", done.stdout + done.stderr)
    return found.group(0) if found else "unknown"


class Tool:
    """One way to copy the table: its command, where it lands and whether that table is made
    (with its primary key) before the run, as the pipe's and pgcopydb's must be."""

    def __init__(
        self, name: str, version: str, command: Callable[[str, str, Path], list[str]], *,
        table: tuple[str, str] = ("public", "mixed"), made_before: bool = False,
        env: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        self.name, self.version, self.command = name, version, command
        self.table, self.made_before, self.env = table, made_before, env or {}

    def run(self, source: str, target: str, scratch: Path) -> tuple[float, float]:
        """Empties or leaves the target as the tool needs, then copies: (seconds, peak MB)."""
        if self.made_before:
            pg.execute(target, "TRUNCATE public.mixed")
        pg.execute(target, "CHECKPOINT")
        seconds, peak, _ = measured(
            self.command(source, target, scratch), {**os.environ, **self.env}
        )
        return seconds, peak


def tools(venv: Path, scratch: Path) -> list[Tool]:
    """The raw pipe, dpone, pgcopydb (when installed), Sling and dlt."""

    def raw(source: str, target: str, _: Path) -> list[str]:
        out = [*pipe.psql_args(source), "-c", "COPY public.mixed TO STDOUT (FORMAT binary)"]
        inp = [*pipe.psql_args(target), "-c", "COPY public.mixed FROM STDIN (FORMAT binary)"]
        return ["bash", "-o", "pipefail", "-c", f"{shlex.join(out)} | {shlex.join(inp)}"]

    def dpone(source: str, target: str, _: Path) -> list[str]:
        return [sys.executable, str(ROOT / "bench" / "snapshot_copy.py"), "--child",
                "cold:batched_copy", "--source", source, "--target", target]  # fmt: skip

    def pgcopydb(source: str, target: str, work: Path) -> list[str]:
        work = Path(tempfile.mkdtemp(dir=work, prefix="pgcopydb-"))
        return ["pgcopydb", "copy", "table-data", "--source", url(source),
                "--target", url(target), "--dir", str(work)]  # fmt: skip

    def sling(source: str, target: str, _: Path) -> list[str]:
        os.environ["DPONE_PEERS_SRC"] = url(source) + "?sslmode=disable"
        os.environ["DPONE_PEERS_TGT"] = url(target) + "?sslmode=disable"
        return [str(sling_binary(venv)), "run", "--src-conn", "DPONE_PEERS_SRC",
                "--src-stream", "public.mixed", "--tgt-conn", "DPONE_PEERS_TGT",
                "--tgt-object", "public.mixed", "--mode", "full-refresh"]  # fmt: skip

    def dlt(source: str, target: str, _: Path) -> list[str]:
        return [str(venv / "bin" / "python"), str(ROOT / "bench" / "peers_dlt.py"),
                url(source, "postgresql+psycopg2"), url(target, password="unused"),
                "public.mixed"]  # fmt: skip

    python = str(venv / "bin" / "python")
    dlt_version = _version([python, "-c", "import dlt; print(dlt.__version__)"])
    import dagster

    from dpone_dagster import __version__ as dpone_version

    found = [
        Tool("raw binary psql pipe", _version(["psql", "--version"]), raw, made_before=True),
        Tool("dpone, cold dagster.materialize", f"{dpone_version}, dagster {dagster.__version__}",
             dpone),
    ]  # fmt: skip
    if shutil.which("pgcopydb"):
        version = _version(["pgcopydb", "--version"])
        found.append(Tool("pgcopydb copy table-data", version, pgcopydb, made_before=True))
    sling_home = {"SLING_HOME_DIR": str(scratch / "sling"), "SLING_DISABLE_TELEMETRY": "true"}
    found.append(Tool("Sling", _version([str(sling_binary(venv)), "--version"]), sling,
                      env=sling_home))  # fmt: skip
    dlt_env = {"DLT_DATA_DIR": str(scratch / "dlt"), "RUNTIME__DLTHUB_TELEMETRY": "false"}
    found.append(Tool("dlt (pyarrow)", dlt_version, dlt, table=("dlt_copy", "mixed"),
                      env=dlt_env))  # fmt: skip
    return found


def make_table(source: str, targets: Sequence[str], rows: int, leave_out: Sequence[str]) -> int:
    """``public.mixed`` of ``rows`` rows in ``source`` (the benchmarks' mixed table without the
    columns ``leave_out``), and its empty copy with its primary key in each of ``targets``; its
    size in MB."""
    for start in range(1, rows + 1, 500_000):
        pg.create_mixed_table(source, "scratch", "mixed", min(500_000, rows - start + 1),
                              start=start)  # fmt: skip
    kept = [c for c in columns(source, "scratch") if c not in leave_out]
    pg.execute(source, sql.SQL("CREATE TABLE public.mixed AS SELECT {} FROM scratch.mixed").format(
        sql.SQL(", ").join(map(sql.Identifier, kept))))  # fmt: skip
    pg.execute(source, "DROP SCHEMA scratch CASCADE; ALTER TABLE public.mixed ADD PRIMARY KEY (id)")
    pg.execute(source, "VACUUM (FREEZE, ANALYZE) public.mixed")
    shape = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t in columns(source).items()
    )
    create = sql.SQL("CREATE TABLE public.mixed ({}, PRIMARY KEY (id))").format(shape)
    for target in targets:
        pg.execute(target, create)
    size = pg.fetch_one(source, "SELECT pg_total_relation_size('public.mixed')")
    return round(int(size) / 1e6)  # type: ignore[call-overload]


def _reason(output: str) -> str:
    """A failed tool's last line that says something, without terminal colours."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in output.splitlines()]
    said = [line for line in lines if line and not set(line) <= set("-=^~ ")]
    return (said[-1] if said else "failed").split(". See ")[0][:160]


def databases(tools: Sequence[Tool], what: str) -> tuple[str, dict[str, str]]:
    """A fresh source database and a fresh target database per tool."""
    source = pg.create_database(f"dpone_peers_{what}_src")
    return source, {t.name: pg.create_database(f"dpone_peers_{what}_tgt") for t in tools}


def drop(source: str, targets: dict[str, str]) -> None:
    for dsn in (source, *targets.values()):
        pg.drop_database(dsn)


def probe(tools: Sequence[Tool], scratch: Path) -> dict[str, str]:
    """Whether each tool copies a table of all 16 columns (:data:`PROBE_ROWS`), equal to its source:
    ``yes``, or ``no:`` and why."""
    source, targets = databases(tools, "probe")
    try:
        make_table(source, [targets[t.name] for t in tools if t.made_before], PROBE_ROWS, ())
        found: dict[str, str] = {}
        for tool in tools:
            try:
                tool.run(source, targets[tool.name], scratch)
                verdict = verify(source, targets[tool.name], tool.table)
                found[tool.name] = "yes" if verdict == "equal" else f"no: {verdict}"
            except RuntimeError as error:
                found[tool.name] = f"no: {_reason(str(error))}"
        return found
    finally:
        drop(source, targets)


def bracketed(
    tools: Sequence[Tool], source: str, targets: dict[str, str], repeat: int, scratch: Path
) -> dict[str, list[dict[str, Any]]]:
    """Each tool's runs, each between two raw-pipe runs (``tools[0]`` is the pipe): seconds,
    peak MB and the pipe's two times around it; the pipe's own runs under its name."""
    raw, peers = tools[0], tools[1:]
    runs: dict[str, list[dict[str, Any]]] = {t.name: [] for t in tools}

    def pipe_run() -> float:
        seconds, peak = raw.run(source, targets[raw.name], scratch)
        runs[raw.name].append({"seconds": seconds, "peak": peak})
        return seconds

    last = pipe_run()
    for _ in range(repeat):
        for tool in peers:
            seconds, peak = tool.run(source, targets[tool.name], scratch)
            after = pipe_run()
            runs[tool.name].append({"seconds": seconds, "peak": peak, "pipes": [last, after]})
            last = after
    return runs


def row(
    tool: Tool, runs: list[dict[str, Any]], rows: int, verdict: str, full: str, limit: float
) -> tuple[dict[str, Any], str | None]:
    """The result's row of one tool, and why its ratio was refused (None: it was not)."""
    best = min(r["seconds"] for r in runs)
    pipes = [p for r in runs for p in r.get("pipes", [r["seconds"]])]
    ratios = [(r["pipes"][0] + r["pipes"][1]) / 2 / r["seconds"] for r in runs if "pipes" in r]
    ratio = pipe.ratio_cell(statistics.median(ratios), pipes, limit) if ratios else "1.00"
    pipe_s, spread = pipe.pipe_cells(pipes)
    return {
        "tool": tool.name,
        "version": tool.version,
        "best_seconds": round(best, 2),
        "rows_per_second": round(rows / best),
        "ratio_to_pipe": ratio,
        "pipe_seconds": pipe_s,
        "pipe_spread": spread,
        "peak_rss_mb": round(max(r["peak"] for r in runs)),
        "target_key": "primary key" if tool.made_before or "dpone" in tool.name else "none",
        "equal_to_source": verdict,
        "all_16_columns": full,
    }, (pipe.refusal(tool.name, pipes, limit) if ratios else None)


def print_table(table: list[dict[str, Any]]) -> None:
    print(f"{'tool':<34} {'s':>7} {'rows/s':>10} {'of pipe':>8} {'pipe s':>7} {'spread':>7} "
          f"{'RSS MB':>7}  equal / all 16 columns")  # fmt: skip
    for r in table:
        print(f"{r['tool']:<34} {r['best_seconds']:>7.2f} {r['rows_per_second']:>10,} "
              f"{r['ratio_to_pipe']:>8} {r['pipe_seconds']:>7} {r['pipe_spread']:>7} "
              f"{r['peak_rss_mb']:>7}  {r['equal_to_source']} / {r['all_16_columns']}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the table")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each tool")
    parser.add_argument(
        "--max-spread",
        type=float,
        default=pipe.MAX_SPREAD,
        help="largest spread of the pipe runs around a tool's runs for a ratio",
    )
    parser.add_argument(
        "--peers-venv",
        type=Path,
        default=ROOT / ".venv-peers",
        help="the peers' virtualenv (made and filled when missing)",
    )
    parser.add_argument("--json", help="also write the result table there (bench/results/...)")
    args = parser.parse_args()  # fmt: skip
    venv = peers_venv(args.peers_venv)
    with tempfile.TemporaryDirectory(prefix="dpone-peers-") as work:
        scratch = Path(work)
        found = tools(venv, scratch)
        if not shutil.which("pgcopydb"):
            print("pgcopydb is not installed (apt-get install -y pgcopydb): left out")
        full = probe(found, scratch)
        source, targets = databases(found, "run")
        try:
            began = result_file.machine(source)
            made = [targets[t.name] for t in found if t.made_before]
            size = make_table(source, made, args.rows, list(REFUSED_COLUMNS))
            print(f"table: {args.rows:,} rows, {size} MB, {len(columns(source))} columns "
                  f"(left out: {', '.join(REFUSED_COLUMNS)}); {os.cpu_count()} cores")  # fmt: skip
            runs = bracketed(found, source, targets, args.repeat, scratch)
            rows = [row(t, runs[t.name], args.rows, verify(source, targets[t.name], t.table),
                        full[t.name], args.max_spread) for t in found]  # fmt: skip
        finally:
            drop(source, targets)
    table = [r for r, _ in rows]
    print_table(table)
    for _, why in rows:
        if why:
            print(why)
    if args.json:
        result_file.write(
            args.json, "peers", began, table, table_rows=args.rows, table_mb=size,
            columns_left_out=REFUSED_COLUMNS, repeat=args.repeat,
            peers_venv=" ".join(PEERS_PACKAGES), max_spread=f"{args.max_spread:.0%}",
        )  # fmt: skip


if __name__ == "__main__":
    main()
