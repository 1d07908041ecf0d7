"""The codebase holds itself to its own rules: lint, types, layers, loadable definitions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def run(*args: str | Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_ruff_is_clean() -> None:
    result = run(BIN / "ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_is_clean_on_the_package() -> None:
    result = run(BIN / "mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_layers_hold() -> None:
    result = run(BIN / "lint-imports")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" not in result.stdout.split("Contracts:")[-1].replace("0 broken", "")


def test_definitions_load() -> None:
    result = run(BIN / "dagster", "definitions", "validate", "-f", "definitions.py")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_readme_opens_with_the_two_commands_that_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    head = readme[: readme.index("## ")]
    assert "<!-- demo-command -->" in head and "<!-- test-command -->" in head
    ci = (ROOT / ".ci" / "run").read_text()
    assert "test-command" in ci, ".ci/run must run the README's test command, extracted verbatim"


def test_every_test_the_docs_name_exists() -> None:
    """Each guarantee in the docs (docs/guarantees.md, and the tables of the job pages) names its
    tests; a renamed or deleted test fails here (tests/test_docs.py writes the page's index)."""
    from tests.test_docs import missing_tests, named_tests

    refs = named_tests()
    assert len(refs) > 40, "the guarantees tables name their tests"
    assert not missing_tests(refs), missing_tests(refs)


def test_the_domain_core_imports_without_loading_dagster() -> None:
    """lifecycle, postgres, the snapshot copy, reconcile, the core, backfill, incremental and
    sources run without Dagster (not even imported)."""
    code = (
        "import sys, dpone_dagster.lifecycle, dpone_dagster.postgres, dpone_dagster.reconcile, "
        "dpone_dagster.snapshot_copy, dpone_dagster.core, dpone_dagster.backfill, "
        "dpone_dagster.incremental, dpone_dagster.sources; "
        "print(sorted(m for m in sys.modules if "
        "m.split('.')[0] "
        "in ('dagster', 'dagster_postgres')))"
    )
    result = run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout


def test_a_run_worker_loads_no_certificate_parser() -> None:
    """A run worker that imports every factory and resource does not load ``cryptography``
    (an import every cold run would pay): only a failed TLS setup reads the server's certificate
    (``tests/tls/test_tls.py`` proves that path)."""
    code = (
        "import sys, dagster; from dpone_dagster import LedgerResource, PostgresSourceResource, "
        "PostgresTargetResource, backfill_asset, incremental_asset, replication_assets, "
        "snapshot_copy_assets; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'cryptography'))"
    )
    result = run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout


def test_the_postgres_toolkit_loads_no_engine() -> None:
    """Every module of the toolkit (``dpone_dagster.postgres``) imports without loading an engine
    (the snapshot copy above it included): the layers contract sees static imports, this sees
    what really loads, the names it lends for one release by name on first use included."""
    code = (
        "import importlib, pkgutil, sys, dpone_dagster.postgres as p; "
        "[importlib.import_module(f'{p.__name__}.{m.name}') "
        "for m in pkgutil.iter_modules(p.__path__)]; "
        "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('dpone_dagster.')}))"
    )
    result = run(sys.executable, "-W", "error", "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['lazy_names', 'lifecycle', 'postgres']", result.stdout


def test_every_public_name_resolves_and_the_top_level_stays_small() -> None:
    """Each name of ``dpone_dagster.__all__`` imports (the lazy Dagster-surface names too), and
    the top level holds what a Dagster user needs, about 16 names (dagster-sling has 8)."""
    code = "import dpone_dagster as d; [getattr(d, n) for n in d.__all__]; print(len(d.__all__))"
    result = run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    # 21 names and __version__: incremental_asset (#11), source_asset_specs (#14: the source
    # tables in the asset graph), KafkaSourceResource and kafka_copy_asset (#28: the Kafka
    # source's resource and factory, a contract of that issue, as for MySQL and REST);
    # replication_assets and drop_replication_job (#23: the names are that contract, and
    # a forgotten slot keeps the source's WAL forever, so its drop is a first-class job); one
    # options object per job beside its factory (#45: at most six, the snapshot copy's, the
    # backfill's, the incremental stream's, the replication group's, the Kafka copy's and the
    # generic sources' copy's), and beside the generic sources' options what each reads (#45:
    # MySQLRead and RestRead, as the Kafka copy names its topic and the snapshot copy its tables).
    assert 10 <= int(result.stdout) <= 30


def test_no_function_is_longer_than_sixty_lines() -> None:
    """Functions short enough to read at once: at most 60 lines, docstring excluded."""
    import ast

    long: list[str] = []
    for path in sorted((ROOT / "dpone_dagster").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            body = node.body
            docstring = (
                isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            )
            first = body[1] if docstring and len(body) > 1 else body[0]
            length = (node.end_lineno or node.lineno) - first.lineno + 1
            if length > 60:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    assert not long, long


def test_the_readmes_dagster_example_builds_its_definitions() -> None:
    """The first Python block of the README (the Dagster example) runs and its definitions load."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```python\n", 1)[1].split("```", 1)[0]
    probe = "defs.resolve_job_def('extract_shop__orders').name"
    code = f"{block}\nprint(len(defs.resolve_all_asset_specs()), {probe})"
    result = run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr[-3000:]
    # Three shop tables, the page views backfill and the incremental stock stream, and the
    # source tables upstream of them (external assets).
    assert result.stdout.split()[:2] == ["10", "extract_shop__orders"], result.stdout


def test_the_architecture_table_names_every_module() -> None:
    """The architecture table (docs/architecture.md) is the map of the package: every module is in
    it, and every module it names exists."""
    import re

    page = (ROOT / "docs" / "architecture.md").read_text()
    table = page.split("<!-- architecture -->", 1)[1].split("<!-- /architecture -->", 1)[0]
    named = set(re.findall(r"`([\w/]+\.py)`", table))
    package = ROOT / "dpone_dagster"
    modules = {
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path.name != "__init__.py" or path.parent == package
    }
    assert sorted(modules - named) == [], (
        "modules missing from the architecture table (docs/architecture.md)"
    )
    assert sorted(named - modules) == [], "the architecture table names modules that do not exist"


def test_every_test_file_that_makes_slots_on_the_shared_logical_server_runs_apart() -> None:
    """A test that makes a replication slot on the suite's logical server runs in the
    ``APART`` unit of ``tests/conftest.py``, one after another with the others: one of them
    lowers ``max_slot_wal_keep_size`` server-wide for a moment (``logical.lose_slot``), which
    would invalidate a slot of a test running beside it (seen in CI)."""
    from tests.conftest import APART

    uses = ("logical_source_dsn", "make_logical_database", "versioned_source_dsn",
            "logical_admin_dsn")  # fmt: skip
    helpers = ROOT / "tests" / "helpers"
    outside = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if helpers not in path.parents and path != Path(__file__).resolve()
        and any(u in path.read_text() for u in uses)
        and not f"{path.relative_to(ROOT)}::".startswith(APART)
    ]  # fmt: skip
    assert outside == [], f"add these to APART in tests/conftest.py: {outside}"
