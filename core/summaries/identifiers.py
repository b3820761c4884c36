"""Identifiers a summary must keep verbatim, and how many of them a summary kept (pure).

An identifier is a string the conversation will need again exactly as written: a URL, a file path,
a shell command that was run, an error name, an id (a UUID, a hash, a booking code, a user id).
The retention score of a summary is the share of the identifiers of the span it replaces that
appear in it; a span without identifiers scores 1.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from recap.core.counting import media
from recap.core.values.records import Msg

MAX_COMMAND_CHARS = 120  # a longer command is kept by its first line, cut here
UUID_DASHES = 4  # a text with fewer dashes holds no UUID
MIN_ID_CHARS = 5  # shorter mixed codes ("A1", "X86") are words, not ids
MAX_IDENTIFIER_CHARS = 200  # a longer "identifier" is a blob of data, not a name

FILE_EXTENSIONS = (
    "py|pyi|ipynb|js|jsx|ts|tsx|mjs|cjs|json|jsonl|yaml|yml|toml|ini|cfg|conf|env|lock|txt|md|rst|"
    "csv|tsv|html|htm|css|scss|xml|sql|sh|bash|zsh|ps1|bat|c|h|cc|cpp|hpp|cs|go|rs|java|kt|kts|"
    "scala|rb|php|pl|swift|m|mm|r|jl|lua|dart|ex|exs|erl|hs|ml|vue|svelte|proto|tf|gradle|mk|cmake|"
    "log|patch|diff|pem|key|crt|enc|bin|so|dll|exe|zip|gz|tar|tgz|whl|png|jpg|jpeg|gif|svg|pdf|"
    "db|sqlite|parquet|pkl|pt|onnx|dockerfile"
)

URL_RE = re.compile(r"\bhttps?://[^\s<>\"'`)\]}]+", re.IGNORECASE)
# A path with a folder ("src/app/main.py", "/etc/hosts", "./run.sh") or a bare file name with a
# known extension ("setup.py").
PATH_RE = re.compile(
    r"(?<![\w/.:-])((?:\.{0,2}/)?(?:[\w.@+-]+/)+[\w.@+-]+|[\w@+-][\w.@+-]*\.(?:"
    + FILE_EXTENSIONS
    + r"))(?![\w/])",
    re.IGNORECASE,
)
ERROR_SUFFIXES = ("Error", "Exception", "Warning", "Exit", "Interrupt", "Fault")
ERROR_RE = re.compile(r"\b[A-Z][A-Za-z0-9]*(?:Error|Exception|Warning|Exit|Interrupt|Fault)\b")
UUID_RE = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I)
HASH_RE = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,64}\b")
# Upper-case codes mixing letters and digits: booking codes, flight numbers, ticket keys.
CODE_RE = re.compile(r"\b(?=[A-Z0-9-]*[A-Z])(?=[A-Z0-9-]*[0-9])[A-Z0-9]+(?:-[A-Z0-9]+)*\b")
# snake_case names ending in digits: user ids such as ``mia_li_3668``.
SNAKE_RE = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")
INLINE_CODE_RE = re.compile(r"`([^`\n]{2,200})`")
COMMAND_HEAD_RE = re.compile(r"(?:\./|/)?[a-z][\w./-]* ")
COMMAND_KEYS = ("command", "cmd", "script")


@dataclass(frozen=True, slots=True)
class Retention:
    """How many of a span's identifiers a summary kept."""

    score: float
    total: int
    missing: tuple[str, ...]


def _clean(token: str) -> str:
    return token.rstrip(".,;:!?'\"")


def _looks_like_path(token: str) -> bool:
    """A rooted path, a deep one, or one ending in a file name: not "and/or" or "n/a"."""
    if "/" not in token:
        return "." in token
    last = token.rstrip("/").rsplit("/", 1)[-1]
    return token.startswith(("/", "./", "../", "~/")) or token.count("/") >= 2 or "." in last


def identifiers_in_text(text: str) -> set[str]:
    """URLs, paths, error names and ids found in free text, each as written."""
    if not text:
        return set()
    found: set[str] = set()
    plain = text
    if "://" in text:
        found |= {_clean(m.group(0)) for m in URL_RE.finditer(text)}
        plain = URL_RE.sub(" ", text)
    if plain.count("-") >= UUID_DASHES:
        found.update(m.group(0) for m in UUID_RE.finditer(plain))
        plain = UUID_RE.sub(" ", plain)
    if "/" in plain or "." in plain:
        for match in PATH_RE.finditer(plain):
            token = _clean(match.group(1))
            if _looks_like_path(token):
                found.add(token)
    if any(suffix in text for suffix in ERROR_SUFFIXES):
        found.update(m.group(0) for m in ERROR_RE.finditer(text))
    found.update(m.group(0) for m in HASH_RE.finditer(plain))
    found.update(m.group(0) for m in CODE_RE.finditer(plain) if len(m.group(0)) >= MIN_ID_CHARS)
    if "_" in plain:
        found.update(
            m.group(0) for m in SNAKE_RE.finditer(plain) if m.group(0).rsplit("_", 1)[1].isdigit()
        )
    return {token for token in found if 1 < len(token) <= MAX_IDENTIFIER_CHARS}


def commands_in_text(text: str) -> set[str]:
    """Commands quoted in prose: inline code spans that read like a command line."""
    found = set()
    for match in INLINE_CODE_RE.finditer(text or ""):
        span = match.group(1).strip()
        if " " in span and COMMAND_HEAD_RE.match(span):
            found.add(span[:MAX_COMMAND_CHARS])
    return found


def command_of_call(arguments: str) -> str | None:
    """The command a shell-like tool call ran (first line, bounded), or None."""
    try:
        parsed = json.loads(arguments) if arguments else None
    except (json.JSONDecodeError, TypeError):
        return None
    if not isinstance(parsed, dict):
        return None
    for key in COMMAND_KEYS:
        value = parsed.get(key)
        if isinstance(value, str) and value.strip():
            first = value.strip().splitlines()[0].strip()
            return first[:MAX_COMMAND_CHARS] if " " in first else None
    return None


def identifiers_of_message(message: Msg) -> set[str]:
    """The identifiers a message contributes to a span.

    User and assistant text, tool-call arguments, the commands the calls ran and the names of
    media parts (``screenshot.png``) all count; of a
    tool result only the error names count (a directory listing's hundred paths are data the
    summary is not expected to carry, the error it raised is not).
    """
    text = media.text_of(message.content, message.content_parts)
    if message.role == "tool":
        return {m.group(0) for m in ERROR_RE.finditer(text)}
    found = identifiers_in_text(text) | commands_in_text(text)
    found.update(name for name in media.names(message.content_parts or ()) if len(name) > 1)
    for call in message.tool_calls:
        function = call.get("function") or {}
        arguments = str(function.get("arguments") or "")
        found |= identifiers_in_text(arguments)
        command = command_of_call(arguments)
        if command:
            found.add(command)
    return found


def identifiers_of_span(messages: Iterable[Msg]) -> set[str]:
    """Every identifier of a run of messages."""
    found: set[str] = set()
    for message in messages:
        found |= identifiers_of_message(message)
    return found


def retention(identifiers: Iterable[str], summary: str) -> Retention:
    """The share of ``identifiers`` found verbatim in ``summary`` (1.0 when there are none)."""
    wanted: Sequence[str] = sorted(set(identifiers))
    if not wanted:
        return Retention(1.0, 0, ())
    missing = tuple(token for token in wanted if token not in summary)
    return Retention((len(wanted) - len(missing)) / len(wanted), len(wanted), missing)
