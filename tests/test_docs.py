"""The docs site (mkdocs.yml, docs/) holds: it builds strictly (a broken link, anchor or API
reference fails), its Python blocks run, its generated parts are the generated ones, and the
README stays what a newcomer reads in five minutes."""

from __future__ import annotations

import importlib.util
import os
import re
import runpy
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import dagster as dg
import pytest

from tests.helpers import pg

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent
README_LIMIT = 12 * 1024


def _docs_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"docs_{name}", DOCS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


GUARANTEES = _docs_script("guarantees")
named_tests: Callable[[], list[Any]] = GUARANTEES.named_tests
missing_tests: Callable[[list[Any]], list[str]] = GUARANTEES.missing_tests


def build(config: Path, into: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "mkdocs"), "build", "--strict", "-f", str(config), "-d", str(into)],
        cwd=config.parent, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip


def test_the_site_builds_strictly_with_every_page_and_the_api_reference(tmp_path: Path) -> None:
    result = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    nav = re.findall(r":\s*([\w-]+)\.md\s*$", (ROOT / "mkdocs.yml").read_text(), re.MULTILINE)
    pages = sorted(path.stem for path in DOCS.glob("*.md"))
    assert sorted(nav) == pages, "every page is in the nav, and the nav names only pages"
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("dpone_dagster.snapshot_copy.copy_tables", "dpone_dagster.backfill_asset"):
        assert f'id="{name}"' in api, f"{name} is missing from the API reference"


@pytest.mark.parametrize(
    "broken", ["[a page](no-such-page.md)", "[a heading](backfill.md#no-such-heading)"]
)
def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path, broken: str) -> None:
    shutil.copytree(DOCS, tmp_path / "docs")
    config = (ROOT / "mkdocs.yml").read_text().replace("paths: [.]", f"paths: [{ROOT}]")
    (tmp_path / "mkdocs.yml").write_text(config)
    with (tmp_path / "docs" / "index.md").open("a") as page:
        page.write(f"\nSee {broken}.\n")
    result = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    assert broken.split("(")[1].rstrip(")") in result.stdout + result.stderr


def test_the_guarantees_index_is_generated_from_the_tests() -> None:
    """docs/guarantees.md ends with the index ``docs/guarantees.py`` writes from the named tests."""
    assert GUARANTEES.generated_block() in (DOCS / "guarantees.md").read_text()


def test_the_readme_is_a_five_minute_read_with_the_two_commands_first() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) < README_LIMIT, f"README.md is {len(readme.encode())} bytes"
    head = readme[: readme.index("\n## ")]
    assert head.index("<!-- demo-command -->") < head.index("<!-- test-command -->")
    # What moved to the site stays there: the architecture table, the guarantees, the changelog.
    for moved in (
        "<!-- architecture -->",
        "<!-- metadata-reference",
        "## Changelog",
        "| Guarantee |",
    ):
        assert moved not in readme, f"{moved!r} lives in docs/, not in the README"
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", readme))
    assert {"getting-started.md", "guarantees.md", "api.md"} <= linked
    assert not [page for page in linked if not (DOCS / page).is_file()], linked


def test_every_benchmark_names_its_command_its_date_and_its_machine() -> None:
    """docs/benchmarks.md: each section's figures come with the ``bench/`` script that measured
    them (and it exists), the day and the machine."""
    page = (DOCS / "benchmarks.md").read_text()
    sections = page.split("\n## ")[1:]
    assert len(sections) >= 6
    for section in sections:
        title = section.splitlines()[0]
        scripts = re.findall(r"\.venv/bin/python (bench/\w+\.py)", section)
        assert scripts and all((ROOT / s).is_file() for s in scripts), title
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", section), f"{title}: no date"
        assert "2-core" in section, f"{title}: no machine"


def test_every_benchmark_the_page_names_starts() -> None:
    """Each ``bench/`` script docs/benchmarks.md names imports what it needs and prints its usage
    (``--help``): a helper moved between the scripts cannot leave one that no longer starts."""
    page = (DOCS / "benchmarks.md").read_text()
    scripts = sorted(set(re.findall(r"\.venv/bin/python (bench/\w+\.py)", page)))
    assert len(scripts) >= 6
    for script in scripts:
        done = subprocess.run(
            [sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True
        )
        assert done.returncode == 0 and "usage:" in done.stdout, f"{script}: {done.stderr}"


@dataclass(frozen=True)
class Block:
    """A Python block of a page, with the ``docs-test`` marker on the line before it."""

    page: str
    line: int
    marker: str
    code: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def python_blocks() -> list[Block]:
    blocks: list[Block] = []
    for page in sorted(DOCS.glob("*.md")):
        lines = page.read_text().splitlines()
        for number, line in enumerate(lines):
            if line.strip() != "```python":
                continue
            end = lines.index("```", number + 1)
            found = re.match(r"<!-- docs-test: (.*) -->", lines[number - 1]) if number else None
            marker = found.group(1) if found else ""
            blocks.append(Block(page.name, number + 1, marker, "\n".join(lines[number + 1 : end])))
    return blocks


BLOCKS = python_blocks()


def test_every_python_block_says_how_it_runs() -> None:
    """Each block is marked ``definitions`` (it builds a dg.Definitions) or ``postgres: TABLES``
    (it runs against fresh source and target databases holding those tables): none is a
    fragment nobody runs."""
    unmarked = [str(b) for b in BLOCKS if not b.marker.startswith(("definitions", "postgres: "))]
    assert len(BLOCKS) >= 8 and not unmarked, unmarked


def _create_table(dsn: str, spec: str) -> None:
    """``schema.name`` (mixed columns, 2,000 rows) or ``schema.name(extras)``: ``updated_at``
    adds an indexed, never NULL timestamptz cursor; ``hstore``/``citext`` a column of that
    extension's type."""
    found = re.fullmatch(r"(\w+)\.([\w ]+?)(?:\((.*)\))?", spec.strip())
    assert found, spec
    schema, name, extras = found.group(1), found.group(2), found.group(3) or ""
    pg.create_mixed_table(dsn, schema, name, rows=2000)
    table = f'"{schema}"."{name}"'
    for extra in filter(None, (part.strip() for part in extras.split(","))):
        if extra == "updated_at":
            pg.execute(
                dsn, f"ALTER TABLE {table} ADD updated_at timestamptz NOT NULL DEFAULT now()"
            )
            pg.execute(dsn, f"CREATE INDEX ON {table} (updated_at)")
        else:
            pg.execute(dsn, f'CREATE EXTENSION IF NOT EXISTS "{extra}"')
            pg.execute(dsn, f'ALTER TABLE {table} ADD "{extra}_value" {extra}')
            pg.execute(dsn, f"UPDATE {table} SET \"{extra}_value\" = 'a=>1'::text::{extra}")


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_the_python_blocks_of_the_docs_run(
    block: Block,
    make_database: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    given: dict[str, Any] = {}
    if block.marker.startswith("postgres: "):
        source, target = make_database("dpone_docs_src"), make_database("dpone_docs_dst")
        for spec in re.split(r",(?![^()]*\))", block.marker.removeprefix("postgres: ")):
            _create_table(source, spec)
        given.update(source_dsn=source, target_dsn=target)
        monkeypatch.setenv("DPONE_SOURCE_DSN", source)
        monkeypatch.setenv("DPONE_TARGET_DSN", target)
    script = tmp_path / f"{block.page[:-3].replace('-', '_')}_{block.line}.py"
    script.write_text(block.code + "\n")
    namespace = runpy.run_path(str(script), init_globals=given)
    if block.marker.startswith("definitions"):
        defs = namespace["defs"]
        assert isinstance(defs, dg.Definitions)
        assert defs.resolve_all_asset_specs(), "the example defines assets"


# The README before the docs site (the merge of #28): its lines now live in docs/ pages.
OLD_README = "b3c529c:README.md"
# Lines changed on purpose when they moved or since (one per line, ``#`` comments).
REWRITTEN = {
    line.strip()  # an indented line may start with "#": a code block's comment
    for line in (ROOT / "tests" / "old_readme_rewritten.txt").read_text().splitlines()
    if line and not line.startswith("#")
}


# Words that pointed inside the one README and now point at a page.
REWORDED = {
    "(see the benchmarks below)": "(see the benchmarks)",
    "the README's architecture table": "the architecture table (docs/architecture.md)",
}


def _plain(line: str) -> str:
    """A line without its link targets, heading marks and indentation."""
    line = re.sub(r"\]\([^)]*\)", "]", line)
    line = re.sub(r" \(`[^`]*` in the repository\)", "", line).replace("[", "").replace("]", "")
    return re.sub(r"\s+", " ", re.sub(r"^\s*#+\s*", "", line)).strip()


def test_every_line_of_the_old_readme_lives_in_a_page() -> None:
    """Nothing was lost in the move: each line of the README of before the site (every guarantee
    row, figure and section) is in a docs page or the README, links aside."""
    old = subprocess.run(
        ["git", "show", OLD_README], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert old.returncode == 0, f"git show {OLD_README} (this test needs the repository's history)"
    texts = [page.read_text() for page in sorted(DOCS.glob("*.md"))]
    now = "\n".join(_plain(line) for text in texts for line in text.splitlines())
    now += "\n" + "\n".join(_plain(line) for line in (ROOT / "README.md").read_text().splitlines())
    lines = old.stdout.splitlines()
    for before, after in REWORDED.items():
        lines = [line.replace(before, after) for line in lines]
    lost = [
        line
        for line in lines
        if _plain(line) and _plain(line) not in now and line.strip() not in REWRITTEN
    ]
    assert not lost, lost[:20]


def test_the_pages_show_only_pictures_the_screenshot_script_takes() -> None:
    """Every ``img/*.png`` a page (or the README) shows is one of ``docs/screenshots.py``'s shots
    and is committed; every shot is shown somewhere: no picture outlives the script."""
    shots = {shot.name for shot in _docs_script("screenshots").SHOTS}
    pages = [*DOCS.glob("*.md"), ROOT / "README.md"]
    shown = {m for p in pages for m in re.findall(r"img/([\w-]+)\.png", p.read_text())}
    assert shown <= shots, f"pictures no shot takes: {sorted(shown - shots)}"
    assert shots <= shown, f"shots no page shows: {sorted(shots - shown)}"
    committed = {p.stem for p in (DOCS / "img").glob("*.png")}
    assert shots <= committed, f"shots not in docs/img: {sorted(shots - committed)}"


def test_the_benchmarks_page_shows_what_the_benchmarks_wrote() -> None:
    """Every ``<!-- bench: NAME -->`` block of docs/benchmarks.md (and of the job pages that show
    one) is the one ``docs/benchmarks.py`` renders from ``bench/results/NAME.json`` (run it after
    a new result), and each says its date, command and machine."""
    script = _docs_script("benchmarks")
    text = (DOCS / "benchmarks.md").read_text()
    names = re.findall(r"<!-- bench: (\w+) -->", text)
    assert names, "the benchmarks page has generated blocks"
    assert script.generated(text) == text, "run .venv/bin/python docs/benchmarks.py"
    for name in names:
        assert (ROOT / "bench" / "results" / f"{name}.json").is_file()
    assert "load average" in text and "PostgreSQL" in text
    for page in script.OTHER_PAGES:  # a job page that shows a benchmark's block
        other = page.read_text()
        assert re.search(r"<!-- bench: (\w+) -->", other), f"{page.name} shows no bench block"
        assert script.generated(other) == other, "run .venv/bin/python docs/benchmarks.py"


def test_the_benchmarks_page_opens_with_the_charts_the_results_draw(tmp_path: Path) -> None:
    """docs/img/bench_*.svg are what ``docs/bench_charts.py`` draws from ``bench/results/`` (run
    ``.venv/bin/python docs/benchmarks.py`` after a new result), and the page shows both before
    its first section, with a line for each ratio the ratios chart leaves out."""
    charts = _docs_script("bench_charts")
    for drawn in charts.draw(tmp_path):
        committed = DOCS / "img" / drawn.name
        assert committed.is_file(), f"{drawn.name} is not committed"
        assert committed.read_bytes() == drawn.read_bytes(), (
            "run .venv/bin/python docs/benchmarks.py"
        )
    page = (DOCS / "benchmarks.md").read_text()
    first = page.index("\n## ")
    assert (
        page.index("(img/bench_ratios.svg)") < first and page.index("(img/bench_peers.svg)") < first
    )
    refused = [r for r in charts.ratios() if r.ratio is None]
    assert len(refused) == page[:first].count(": refused, the raw pipe runs around it spread")
