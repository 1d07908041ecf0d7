"""Removes secrets from text before it reaches a note, a log line or a receipt."""

from __future__ import annotations

import re

# postgresql://user:secret@host/db -> postgresql://user:***@host/db
_URI_PASSWORD = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:@/\s]*):[^@/\s]*@")
# password=secret, password = 'se cret' (libpq keyword/value form)
_KEYWORD_PASSWORD = re.compile(
    r"(?P<key>\b(?:password|passwd|pwd)\s*=\s*)(?:'(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE
)


def redact(text: str) -> str:
    """Returns ``text`` with every password in a DSN or conninfo string replaced by ``***``.

    Args:
        text: Any message that may quote a connection string.

    Returns:
        The same text, with URI passwords and ``password=...`` values masked.

    Examples:
        >>> redact("could not connect to postgresql://app:s3cret@db:5432/prod")
        'could not connect to postgresql://app:***@db:5432/prod'
    """
    text = _URI_PASSWORD.sub(r"\g<scheme>\g<user>:***@", text)
    return _KEYWORD_PASSWORD.sub(r"\g<key>***", text)
