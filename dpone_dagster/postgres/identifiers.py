"""PostgreSQL names: parsing user text into exact identifiers, and composing them safely.

Any legal PostgreSQL identifier works (spaces, quotes, upper case, unicode, ``;`` and ``--``):
names reach SQL text only through :class:`psycopg.sql.Identifier`, never through string
formatting. What is refused is what PostgreSQL itself would mangle: an empty name, a NUL byte,
or a name longer than 63 bytes (the server silently truncates those, so two different names
could reach the same table).
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from dpone_dagster.lifecycle import DponeError

MAX_IDENTIFIER_BYTES = 63
"""NAMEDATALEN - 1 on a stock PostgreSQL build."""


class IdentifierError(DponeError):
    """A table, schema or column name that cannot be used safely."""


def check_identifier(name: str, *, what: str = "identifier") -> str:
    """Returns ``name`` unchanged if PostgreSQL can hold it exactly, else raises.

    Args:
        name: The exact identifier (already unquoted).
        what: What the name is, for the error message (``schema``, ``column``...).

    Raises:
        IdentifierError: ``identifier_invalid`` for an empty name, a NUL byte or more than
            63 bytes in UTF-8.
    """
    if not name:
        raise IdentifierError(
            "identifier_invalid", f"The {what} name is empty.", [f"Give the {what} a name."]
        )
    if "\x00" in name:
        raise IdentifierError(
            "identifier_invalid",
            f"The {what} name {name!r} contains a NUL byte, which PostgreSQL cannot store.",
            [f"Remove the NUL byte from the {what} name."],
        )
    if len(name.encode()) > MAX_IDENTIFIER_BYTES:
        raise IdentifierError(
            "identifier_invalid",
            f"The {what} name {name!r} is {len(name.encode())} bytes long; PostgreSQL would "
            f"silently truncate it to {MAX_IDENTIFIER_BYTES} bytes and could reach another object.",
            [f"Use a {what} name of at most {MAX_IDENTIFIER_BYTES} bytes in UTF-8."],
        )
    return name


def _is_plain(part: str) -> bool:
    """True when ``part`` is a valid unquoted identifier (folded to lower case by PostgreSQL)."""
    first = part[0]
    if not (first.isalpha() or first == "_"):
        return False
    return all(ch.isalnum() or ch in "_$" for ch in part)


def split_qualified(text: str) -> list[str]:
    """Splits ``schema.table`` text the way PostgreSQL reads it.

    Double-quoted parts keep their exact spelling (``""`` is a quote inside them); unquoted parts
    fold to lower case and must be plain identifiers.

    Raises:
        IdentifierError: ``identifier_invalid`` for unbalanced quotes, empty parts or an unquoted
            part that PostgreSQL would not accept.
    """
    parts: list[str] = []
    i, n = 0, len(text)
    while True:
        if i < n and text[i] == '"':
            j, buf = i + 1, []
            while True:
                if j >= n:
                    raise IdentifierError(
                        "identifier_invalid",
                        f"Unterminated double quote in {text!r}.",
                        ['Close every quoted part: "My Schema"."My Table".'],
                    )
                if text[j] == '"':
                    if j + 1 < n and text[j + 1] == '"':
                        buf.append('"')
                        j += 2
                        continue
                    break
                buf.append(text[j])
                j += 1
            parts.append(check_identifier("".join(buf)))
            i = j + 1
        else:
            j = text.find(".", i)
            raw = text[i:] if j < 0 else text[i:j]
            stripped = raw.strip()
            if not stripped or not _is_plain(stripped):
                raise IdentifierError(
                    "identifier_invalid",
                    f"{raw!r} in {text!r} is not a plain identifier.",
                    ['Quote names with spaces, capitals or symbols: public."Order Items".'],
                )
            parts.append(check_identifier(stripped.lower()))
            i = n if j < 0 else j
        if i >= n:
            return parts
        if text[i] != ".":
            raise IdentifierError(
                "identifier_invalid",
                f"Unexpected {text[i]!r} after a quoted name in {text!r}.",
                ['Separate parts with a dot: "schema"."table".'],
            )
        i += 1
        if i >= n:
            raise IdentifierError(
                "identifier_invalid", f"{text!r} ends with a dot.", ["Remove the trailing dot."]
            )


@dataclass(frozen=True, order=True)
class TableName:
    """An exact, schema-qualified PostgreSQL table name.

    Build it from exact parts (``TableName("sales", "Order Items")``) or parse user text with
    :meth:`parse` (``TableName.parse('sales."Order Items"')``).

    Attributes:
        schema: The exact schema name.
        name: The exact table name.
    """

    schema: str
    name: str

    def __post_init__(self) -> None:
        check_identifier(self.schema, what="schema")
        check_identifier(self.name, what="table")

    @classmethod
    def parse(cls, text: str, *, default_schema: str = "public") -> TableName:
        """Parses ``table`` or ``schema.table`` as PostgreSQL would read it.

        Args:
            text: The name as a user writes it in SQL.
            default_schema: The schema of an unqualified name.

        Raises:
            IdentifierError: ``identifier_invalid`` for anything PostgreSQL would not read as one
                table name.

        Examples:
            >>> TableName.parse('sales."Order Items"')
            TableName(schema='sales', name='Order Items')
            >>> TableName.parse("Orders")
            TableName(schema='public', name='orders')
        """
        parts = split_qualified(text)
        if len(parts) == 1:
            return cls(default_schema, parts[0])
        if len(parts) == 2:
            return cls(parts[0], parts[1])
        raise IdentifierError(
            "identifier_invalid",
            f"{text!r} has {len(parts)} parts; expected table or schema.table.",
            ["Name the table as schema.table (the database comes from the DSN)."],
        )

    @property
    def ident(self) -> sql.Identifier:
        """The name composed for SQL text."""
        return sql.Identifier(self.schema, self.name)

    @property
    def qualified(self) -> str:
        """The name as PostgreSQL would print it, quoted where needed."""
        return f"{quote_identifier(self.schema)}.{quote_identifier(self.name)}"

    def __str__(self) -> str:
        return self.qualified


def quote_identifier(name: str) -> str:
    """Returns ``name`` as SQL text would spell it: bare when plain lower case, else quoted.

    For display and for keys only; SQL text is always composed with :class:`psycopg.sql.Identifier`.
    """
    if _is_plain(name) and name == name.lower() and name.isascii():
        return name
    return '"' + name.replace('"', '""') + '"'
