"""dlt's copy of one PostgreSQL table into PostgreSQL, as a dlt user writes it (``bench/peers.py``).

Runs in the peers' own virtualenv (``.venv-peers``, which holds dlt), not the project's: the
``sql_database`` source's ``sql_table`` with the ``pyarrow`` backend, the ``postgres``
destination, ``write_disposition="replace"``, into the dataset (schema) ``dlt_copy``.

Usage: ``.venv-peers/bin/python bench/peers_dlt.py SOURCE_URL TARGET_URL SCHEMA.TABLE``.
"""

from __future__ import annotations

import sys

import dlt
from dlt.sources.sql_database import sql_table


def main() -> None:
    source, target, table = sys.argv[1:4]
    schema, name = table.split(".")
    resource = sql_table(
        credentials=source, schema=schema, table=name, backend="pyarrow", chunk_size=100_000
    )
    pipeline = dlt.pipeline(
        pipeline_name="dpone_peers",
        destination=dlt.destinations.postgres(credentials=target),
        dataset_name="dlt_copy",
    )
    info = pipeline.run(resource, write_disposition="replace")
    info.raise_on_failed_jobs()


if __name__ == "__main__":
    main()
