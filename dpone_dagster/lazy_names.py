"""Names a package imports on first use (PEP 562): importing the package loads only what is used.

The same hook keeps a name that moved to another package importable from its old package for
one release (:func:`moved_names`), with a ``DeprecationWarning`` naming its new home.

A cold run worker imports Dagster, the code location and, through it, the package; a package
that imported every module it names up front would load every engine (the backfill, the
stream, replication, the generic sources and their clients) for a run that copies one table.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    package: str, names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose ``names`` are imported on first
    use, each from its module (a name relative to ``package``, such as ``.backfill``).

    Args:
        package: The package's ``__name__`` (it is being initialized).
        names: Each lazy name and the module it is imported from.
    """
    namespace = sys.modules[package].__dict__

    def getattr_(name: str) -> Any:
        """Imports ``name`` on first use and keeps it in the package."""
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        """The package's names with the lazy ones (``dg list components`` reads them)."""
        return sorted({*namespace, *names})

    return getattr_, dir_


def moved_names(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package`` for ``names`` that moved to other packages: each still
    imports from ``package`` for one release, from its new home, with a ``DeprecationWarning``
    every time (nothing is kept in ``package``, so the old package never holds the new one's
    objects by itself and importing it loads nothing of the new home).

    Args:
        package: The old package's ``__name__`` (it is being initialized).
        names: Each moved name and the package it now lives in.
    """

    def getattr_(name: str) -> Any:
        """Imports ``name`` from its new home, warning that it moved."""
        home = names.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        warnings.warn(
            f"{package}.{name} moved to {home}.{name}: import it from {home} "
            f"(the old name is removed in the next release).",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(home), name)

    return getattr_
