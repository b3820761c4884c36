"""Header values of any script, both ways, by one rule.

HTTP header values are bytes that servers and clients read as Latin-1; a conversation id in
Chinese or with an emoji cannot be written as it is. Recap writes every header value it sets
percent-encoded: the value's UTF-8 bytes, each byte outside printable ASCII (and space and ``%``
itself) written as ``%XX``. An ASCII id without ``%`` or spaces is therefore written unchanged,
and ``urllib.parse.unquote`` (or JavaScript's ``decodeURIComponent``) gives any id back exactly.

A header Recap reads (``X-Recap-Conversation``) is decoded by the same rule: its bytes as UTF-8
(so a client that writes raw UTF-8 is understood too), then ``%XX`` escapes decoded. The value a
response carried, sent back as it is, names the same conversation.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote, unquote

# Printable ASCII except space and "%": written as they are; every other byte as %XX.
SAFE = "".join(chr(code) for code in range(0x21, 0x7F) if chr(code) != "%")


def encode(value: str) -> str:
    """``value`` as a header value: ASCII only, decodable back to ``value`` exactly."""
    return quote(value, safe=SAFE, errors="strict")


def decode(raw: str) -> str:
    """A header value as Starlette gives it (its bytes read as Latin-1) decoded by the rule;
    a ``ValueError`` when it is not UTF-8 (raw, or in its escapes)."""
    try:
        text = raw.encode("latin-1").decode("utf-8")
        return unquote(text, errors="strict")
    except UnicodeError as exc:
        raise ValueError("not UTF-8") from exc


def encoded(headers: Mapping[str, str]) -> dict[str, str]:
    """Every value of ``headers`` encoded by the rule (names are Recap's own ASCII)."""
    return {name: encode(value) for name, value in headers.items()}
