"""Keys handed to the server as text (``postgres.text_keys.TextKeys``): every key the engines
look rows up by goes this way, so its text must come back as exactly the key it was, for every
key type and any text, and find the row through the key's index."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from dpone_dagster.postgres import TableName
from dpone_dagster.postgres.catalog import table_catalog
from dpone_dagster.postgres.text_keys import TextKeys

# A composite key of awkward types: a user-defined enum in a schema off the search path (its
# cast must name the schema), a numeric whose scale is part of its text, a timestamp with a
# time zone, and text with the characters a text format would have to escape.
TABLE = """
CREATE SCHEMA "odd ""types";
CREATE TYPE "odd ""types".mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE public.keyed (
    mood "odd ""types".mood, amount numeric(10,2), at timestamptz, label text, payload int,
    PRIMARY KEY (mood, amount, at, label)
);
INSERT INTO public.keyed
SELECT (ARRAY['sad', 'ok', 'happy'])[1 + g % 3]::"odd ""types".mood, g * 1.25,
       timestamptz '2026-01-01 00:00+00' + g * interval '1 hour',
       E'tab\\there, quote '' and " back\\\\slash\\nnewline ü ' || g, g
FROM generate_series(1, 2000) g;
ANALYZE public.keyed;
"""
KEY_TEXT = (
    "SELECT ARRAY[mood::text, amount::text, at::text, label] FROM public.keyed"
    " WHERE payload = ANY(%s) ORDER BY payload"
)


@pytest.fixture
def keyed(source_dsn: str) -> Iterator[tuple[psycopg.Connection, TextKeys, list[list[str]]]]:
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        conn.execute(TABLE)
        catalog = table_catalog(conn, TableName("public", "keyed"))
        by_name = {c.name: c for c in catalog.columns}
        keys = [list(r[0]) for r in conn.execute(KEY_TEXT, ([7, 700, 1999],))]
        yield conn, TextKeys.of([by_name[k] for k in catalog.key], keys), keys


def test_keys_given_as_text_find_exactly_their_rows_through_the_key_index(
    keyed: tuple[psycopg.Connection, TextKeys, list[list[str]]],
) -> None:
    conn, given, keys = keyed
    query = sql.SQL("SELECT t.payload, {} FROM {} JOIN public.keyed AS t ON {} ORDER BY 1").format(
        given.as_text(), given.rows(), given.equal("t")
    )
    rows = conn.execute(query, given.params).fetchall()
    assert [r[0] for r in rows] == [7, 700, 1999]
    assert [list(r[1]) for r in rows] == keys  # the text comes back as it was given
    conn.execute("SET enable_seqscan = off")  # the plan may use the key's index at all
    plan = "\n".join(r[0] for r in conn.execute(sql.SQL("EXPLAIN ") + query, given.params))
    assert "keyed_pkey" in plan, plan


def test_a_key_whose_text_differs_in_one_character_finds_nothing(
    keyed: tuple[psycopg.Connection, TextKeys, list[list[str]]],
) -> None:
    conn, given, keys = keyed
    near = [
        [keys[0][0], keys[0][1], keys[0][2], keys[0][3] + " "],  # the label
        [keys[1][0], "875.01", keys[1][2], keys[1][3]],  # the amount
        ["happy" if keys[2][0] != "happy" else "sad", *keys[2][1:]],  # the enum
    ]
    other = TextKeys.of(given.columns, near)
    query = sql.SQL("SELECT count(*) FROM {} JOIN public.keyed AS t ON {}").format(
        other.rows(), other.equal("t")
    )
    assert conn.execute(query, other.params).fetchone() == (0,)


def test_typed_keys_and_arrays_beside_them(
    keyed: tuple[psycopg.Connection, TextKeys, list[list[str]]],
) -> None:
    conn, given, _ = keyed
    typed = sql.SQL(
        "SELECT f.payload_wanted, t.payload FROM (SELECT {}, u.payload_wanted FROM {}) AS f"
        " JOIN public.keyed AS t USING (mood, amount, at, label) ORDER BY 1"
    ).format(given.typed(), given.rows(("payload_wanted", "int[]")))
    rows = conn.execute(typed, [*given.params, [7, 700, 1999]]).fetchall()
    assert rows == [(7, 7), (700, 700), (1999, 1999)]


def test_arrays_of_another_width_than_the_key_are_refused(
    keyed: tuple[psycopg.Connection, TextKeys, list[list[str]]],
) -> None:
    _, given, _ = keyed
    with pytest.raises(ValueError, match="3 key arrays for 4 key columns"):
        TextKeys.from_arrays(given.columns, given.arrays[:3])
