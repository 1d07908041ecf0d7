"""Rewrites the tables of every ``dpone/`` key in docs/metadata.md from the metadata sets.

Run ``.venv/bin/python docs/metadata_reference.py`` after changing a field of a job's set
(dpone_dagster/dagster/metadata/keys/) or of ``DponeRunTags``
(dpone_dagster/dagster/metadata/tags.py);
``tests/dagster/test_metadata_sets.py`` fails while the page's table is not the generated one.
"""

import re
from pathlib import Path

from dpone_dagster.dagster.metadata.sets import markdown_reference

PAGE = Path(__file__).resolve().parent / "metadata.md"
START, END = "<!-- metadata-reference: start -->", "<!-- metadata-reference: end -->"


def main() -> None:
    text = PAGE.read_text()
    block = re.compile(re.escape(START) + r".*?" + re.escape(END), re.DOTALL)
    assert block.search(text), f"docs/metadata.md has no {START} ... {END} block"
    generated = f"{START}\n{markdown_reference()}{END}"
    PAGE.write_text(block.sub(lambda _: generated, text))


if __name__ == "__main__":
    main()
