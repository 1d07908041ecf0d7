"""The Dagster versions the package supports: ranges, not pins, whose lower bounds are the pins
CI's second venv is built with (``.ci/lowest.txt``), and a Dagster outside them fails at
install."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
FAMILY = ("dagster", "dagster-postgres", "dagster-celery", "dagster-webserver",
          "dagster-dg-cli", "create-dagster")  # fmt: skip
"""The Dagster libraries the package or its extras require, which a user also installs."""


def declared() -> dict[str, Requirement]:
    """Each Dagster library's requirement in pyproject.toml (dependencies and extras)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = [*project["dependencies"], *(r for e in project["optional-dependencies"].values()
                                         for r in e)]  # fmt: skip
    found = [Requirement(line) for line in lines]
    return {r.name: r for r in found if r.name in FAMILY}


def lowest() -> dict[str, Version]:
    """The pins of .ci/lowest.txt."""
    pins = {}
    for line in (ROOT / ".ci" / "lowest.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.strip()] = Version(version.strip())
    return pins


def test_every_dagster_library_has_a_range_whose_lower_bound_ci_installs() -> None:
    """No exact pin: each Dagster library is a range with a lower and an upper bound; the lower
    bound is what .ci/lowest.txt pins (so CI's lowest venv tests exactly it), and this venv's
    installed versions fall inside."""
    requirements, pins = declared(), lowest()
    assert set(requirements) == set(FAMILY) == set(pins), (set(requirements), set(pins))
    for name, requirement in requirements.items():
        operators = {s.operator for s in requirement.specifier}
        assert operators == {">=", "<"}, f"{requirement}: a range, not a pin"
        [floor] = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        assert floor == pins[name], f"{requirement}: .ci/lowest.txt pins {pins[name]}"
        assert pins[name] in requirement.specifier
        installed = importlib.metadata.version(name)
        assert installed in requirement.specifier, f"{name} {installed} is outside {requirement}"
        if Path(sys.prefix).name == ".venv-lowest":  # CI's venv of the lowest: exactly the pins
            assert Version(installed) == pins[name], f"{name} {installed} in .venv-lowest"
    # dagster-postgres pins one dagster release exactly: an extra, never a dependency.
    required = [Requirement(r) for r in importlib.metadata.requires("dpone-dagster") or []]
    assert "dagster-postgres" not in {r.name for r in required if r.marker is None}


def test_a_dagster_below_the_range_fails_at_install() -> None:
    """pip refuses to install the package beside the last Dagster release below its range and
    names the conflict (it asks the package index for that release)."""
    below = "1.12.14"
    assert Version(below) not in declared()["dagster"].specifier
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", f"dagster=={below}", str(ROOT)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode != 0, said[-3000:]
    assert "conflicting dependencies" in said, said[-3000:]
    assert "dpone-dagster 0.1.0 depends on dagster<1.14 and >=1.12.15" in said, said[-3000:]
