"""A griffe extension for the API reference: the docstrings' Sphinx roles read as code.

The docstrings cross-reference with Sphinx roles (``:class:`~dpone_dagster.DponeFailure```,
``:func:`.mark.take_mark```); mkdocstrings writes Markdown, where a role would show as written.
Each becomes a code span of the name (its last part under ``~``), as Sphinx would show it.
mkdocs.yml loads this file (``extensions`` of the python handler).
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

_ROLE = re.compile(r":(?:py:)?(?:class|func|mod|meth|attr|exc|data|obj):`([^`]+)`")


def _name(match: re.Match[str]) -> str:
    target = match.group(1).strip()
    if "<" in target and target.endswith(">"):
        return f"`{target.split('<', 1)[0].strip()}`"
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target}`"


def plain_roles(text: str) -> str:
    """``text`` with each Sphinx role written as a code span of its name."""
    return _ROLE.sub(_name, text)


class SphinxRoles(Extension):
    """Rewrites each object's docstring as it is loaded."""

    def on_instance(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(obj.docstring.value)
