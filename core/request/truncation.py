"""Previews of oversized tool outputs and arguments, made once on the way in (pure).

An output over the line or byte limit keeps a preview in its row (head and tail of the text, or
the structure of a JSON search result) and a note saying where the full text was saved;
``core.storage.outputs`` writes the file. A tool call's long arguments are cut the same way.
Everything here is string work.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PREVIEW_SHARE = 0.2  # a preview keeps a fifth of the limits: 400 lines / 10 KB by default
HEAD_SHARE = (
    0.6  # of a preview, the head; the tail (where test logs put their errors) gets the rest
)
PREVIEW_MIN_BYTES = 512  # even with tiny limits a preview shows something useful
PREVIEW_MIN_LINES = 4
SNIPPET_CHARS = 200  # a search hit keeps this much of its snippet
FIELD_CHARS = 300  # an identity field (title, url, path) longer than this is clipped too
MAX_JSON_DEPTH = 3  # how deep a JSON preview looks for the list of hits
ARGUMENT_HEAD_SHARE = 0.7  # a trimmed argument keeps mostly its beginning

IDENTITY_KEYS = frozenset(
    {
        "id", "_id", "doc_id", "document_id", "key", "title", "name", "url", "link", "href",
        "uri", "path", "file", "filename", "source", "score", "_score", "rank", "relevance",
        "similarity", "distance", "date", "published", "type", "line", "line_number", "lineno",
    }
)  # fmt: skip
SNIPPET_KEYS = frozenset(
    {
        "snippet", "summary", "description", "text", "content", "body", "abstract", "excerpt",
        "highlight", "highlights", "preview", "message", "match", "context",
    }
)  # fmt: skip
HIT_LIST_KEYS = ("results", "items", "hits", "documents", "docs", "matches", "data", "entries")


@dataclass(frozen=True, slots=True)
class Limits:
    """When an output counts as oversized, and how large its preview may be."""

    max_lines: int
    max_bytes: int

    @property
    def preview_lines(self) -> int:
        return max(PREVIEW_MIN_LINES, int(self.max_lines * PREVIEW_SHARE))

    @property
    def preview_bytes(self) -> int:
        return max(PREVIEW_MIN_BYTES, int(self.max_bytes * PREVIEW_SHARE))


def byte_size(text: str) -> int:
    """UTF-8 size of a text."""
    return len(text.encode("utf-8"))


def line_count(text: str) -> int:
    """Lines of a text (a last line without a newline counts)."""
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def is_oversized(text: str, limits: Limits) -> bool:
    """Whether an output goes over the line or the byte limit."""
    return byte_size(text) > limits.max_bytes or line_count(text) > limits.max_lines


def output_preview(text: str, location: str, limits: Limits) -> str:
    """The preview stored instead of an oversized output: a note saying what was cut and where the
    full text is, then the JSON structure of a search-like result or the head and tail of the text.
    """
    size, lines = byte_size(text), line_count(text)
    structured = json_preview(text, limits.preview_bytes)
    if structured is not None:
        body, shown = structured
        what = f"showing {shown}"
    else:
        body, head_lines, tail_lines = head_tail(text, limits.preview_lines, limits.preview_bytes)
        what = f"showing the first {head_lines} and the last {tail_lines} lines"
    note = (
        f"[Output truncated: {size} bytes in {lines} lines; {what}. "
        f"The full output is saved at {location}; read that file for the rest.]"
    )
    return f"{note}\n{body}"


def head_tail(text: str, max_lines: int, max_bytes: int) -> tuple[str, int, int]:
    """The head and tail of a text within a line and byte budget, with a marker for the middle;
    returns the preview and how many lines of the head and of the tail it shows."""
    lines = text.splitlines(keepends=True)
    head_budget = (int(max_lines * HEAD_SHARE), int(max_bytes * HEAD_SHARE))
    tail_budget = (max_lines - head_budget[0], max_bytes - head_budget[1])
    head = _take(lines, *head_budget)
    rest = lines[len(head) :]
    tail = _take(rest[::-1], *tail_budget)[::-1]
    middle = rest[: len(rest) - len(tail)]
    partial = 0
    if not head and middle:  # a first line longer than the head budget: its start
        head, partial = [_clip_bytes(middle[0], head_budget[1])], partial + 1
    if not tail and middle:  # a last line longer than the tail budget: its end
        tail, partial = [_clip_bytes(middle[-1], tail_budget[1], from_end=True)], partial + 1
    shown = "".join(head) + "".join(tail)
    omitted_bytes = byte_size(text) - byte_size(shown)
    omitted_lines = max(len(middle) - partial, 0)
    marker = f"[... {omitted_lines} lines ({omitted_bytes} bytes) omitted ...]\n"
    head_text = "".join(head)
    if head_text and not head_text.endswith("\n"):
        head_text += "\n"
    return head_text + marker + "".join(tail), len(head), len(tail)


def _take(lines: Sequence[str], max_lines: int, max_bytes: int) -> list[str]:
    taken: list[str] = []
    used = 0
    for line in lines[:max_lines]:
        size = byte_size(line)
        if used + size > max_bytes:
            break
        taken.append(line)
        used += size
    return taken


def _clip_bytes(text: str, max_bytes: int, *, from_end: bool = False) -> str:
    """At most ``max_bytes`` of a text, cut on a character boundary."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    part = data[-max_bytes:] if from_end else data[:max_bytes]
    return part.decode("utf-8", errors="ignore")


def clip_chars(text: str, max_chars: int, head_share: float = ARGUMENT_HEAD_SHARE) -> str:
    """A text cut to about ``max_chars`` characters, keeping its start and end."""
    if len(text) <= max_chars:
        return text
    head = int(max_chars * head_share)
    tail = max_chars - head
    omitted = len(text) - head - tail
    return f"{text[:head]}[... {omitted} characters omitted ...]{text[len(text) - tail :]}"


# --- JSON previews -----------------------------------------------------------------------------


def json_preview(text: str, max_bytes: int) -> tuple[str, str] | None:
    """For a JSON result holding a list of hits (search, retrieval, listing tools): the same JSON
    with each hit cut to its identity fields and a short snippet, as many hits as fit
    ``max_bytes``. Returns the JSON text and what it shows, or None for any other output."""
    stripped = text.lstrip()
    if not stripped.startswith(("[", "{")):
        return None
    try:
        document = json.loads(text)
    except ValueError:
        return None
    found = _find_hits(document, (), 0)
    if found is None:
        return None
    path, hits = found
    shrunk = [_shrink_hit(hit) for hit in hits]
    kept = _fit_hits(document, path, shrunk, max_bytes)
    if kept == 0:
        return None
    body = _dump(_with_hits(document, path, shrunk[:kept]))
    where = "/".join(str(part) for part in path) or "the top-level list"
    return body, f"the first {kept} of {len(hits)} results of {where}, each cut to its key fields"


def _find_hits(
    node: Any, path: tuple[str, ...], depth: int
) -> tuple[tuple[str, ...], list[Any]] | None:
    """The longest list of JSON objects in the document (named hit lists preferred)."""
    if isinstance(node, list):
        if node and all(isinstance(item, dict) for item in node):
            return path, node
        return None
    if not isinstance(node, dict) or depth >= MAX_JSON_DEPTH:
        return None
    candidates = []
    for key, value in node.items():
        found = _find_hits(value, (*path, str(key)), depth + 1)
        if found is not None:
            candidates.append((key in HIT_LIST_KEYS, len(found[1]), found))
    if not candidates:
        return None
    return max(candidates, key=lambda c: (c[0], c[1]))[2]


def _shrink_hit(hit: Mapping[str, Any]) -> dict[str, Any]:
    """A hit cut to its identity fields and short snippets (or short scalars when it has none)."""
    known = [key for key in hit if key in IDENTITY_KEYS or key in SNIPPET_KEYS]
    keys = known or list(hit)
    out: dict[str, Any] = {}
    for key in keys:
        value = hit[key]
        limit = SNIPPET_CHARS if key in SNIPPET_KEYS or not known else FIELD_CHARS
        if isinstance(value, str):
            out[key] = clip_chars(value, limit, head_share=1.0) if len(value) > limit else value
        elif value is None or isinstance(value, bool | int | float):
            out[key] = value
        elif key in SNIPPET_KEYS:
            out[key] = clip_chars(_dump(value), limit, head_share=1.0)
    return out


def _with_hits(document: Any, path: tuple[str, ...], hits: list[dict[str, Any]]) -> Any:
    """The document with the hit list replaced; sibling scalars kept, other bulk dropped."""
    if not path:
        return hits
    assert isinstance(document, dict)
    out: dict[str, Any] = {}
    for key, value in document.items():
        if key == path[0]:
            out[key] = _with_hits(value, path[1:], hits)
        elif value is None or isinstance(value, bool | int | float):
            out[key] = value
        elif isinstance(value, str):
            out[key] = clip_chars(value, FIELD_CHARS, head_share=1.0)
    return out


def _fit_hits(document: Any, path: tuple[str, ...], hits: list[dict[str, Any]], budget: int) -> int:
    """How many hits fit the byte budget (a binary search over the rendered size)."""
    low, high = 0, len(hits)
    while low < high:
        middle = (low + high + 1) // 2
        if byte_size(_dump(_with_hits(document, path, hits[:middle]))) <= budget:
            low = middle
        else:
            high = middle - 1
    return low


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# --- oversized arguments -----------------------------------------------------------------------


def trim_arguments(
    arguments: str, location: str, max_chars: int, *, note: str | None = None
) -> str | None:
    """Arguments of a tool call (a ``write_file``/``edit_file`` with a whole file in them) cut to
    about ``max_chars``: each long string field keeps its start and end and says where the full
    call was saved (or ``note``). Returns None when the arguments are within the limit."""
    if len(arguments) <= max_chars:
        return None
    if note is None:
        note = f" [full arguments saved at {location}]"
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        long_fields = [k for k, v in parsed.items() if isinstance(v, str) and len(v) > 64]
        if long_fields:
            share = max(max_chars // len(long_fields) - len(note), 64)
            trimmed = {
                key: clip_chars(value, share) + note if key in long_fields else value
                for key, value in parsed.items()
            }
            return _dump(trimmed)
    return clip_chars(arguments, max_chars) + note
