"""The offline summarizer: fills the summary template from the messages themselves (pure).

Used when no summary model is configured. It quotes rather than paraphrases: the first request as
the goal, the user's constraints, the tool calls made, the assistant's stated decisions, the errors
seen, the media shared (kind, name, size), and every identifier verbatim. Given the previous
summary it merges into it, keeping each section bounded, so a long conversation's summary does
not grow without end.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from recap.core.counting import media
from recap.core.summaries.identifiers import ERROR_RE, identifiers_of_span
from recap.core.summaries.planning import describe_calls, tool_names, trim_text
from recap.core.summaries.prompts import EXTRACTIVE_NOTE
from recap.core.values.records import ClearingRec, Msg

QUOTE_CHARS = 240  # one quoted sentence or request
GOAL_CHARS = 400  # the goal is the first request, cut here
CALL_CHARS = 160  # one tool call as listed under progress
SECTION_ITEMS = {  # newest items kept per section when merging with the previous summary
    "Goal": 2,
    "Constraints and preferences": 8,
    "Done": 12,
    "In progress": 1,
    "Blocked": 5,
    "Key decisions": 8,
    "Next steps": 2,
    "Critical context": 8,
    "Media": 20,
    "Identifiers": 60,
    "Relevant files": 40,
}
CONSTRAINT_RE = re.compile(
    r"\b(?:must|should|shouldn't|don't|do not|never|always|prefer|please|only|without|"
    r"make sure|avoid|required?)\b",
    re.IGNORECASE,
)
DECISION_RE = re.compile(
    r"\b(?:I'll|I will|let's|let me|we will|we'll|decided|going to|instead|the fix|the issue is|"
    r"the problem is|the cause|because)\b",
    re.IGNORECASE,
)
SENTENCE_RE = re.compile(r"(?<=[.!?])\s+|\n+")
ERROR_LINE_RE = re.compile(r"(?:error|exception|traceback|failed|fatal)", re.IGNORECASE)


def _sentences(text: str) -> list[str]:
    return [s.strip(" -*#\t") for s in SENTENCE_RE.split(text or "") if s.strip(" -*#\t")]


def _quote(text: str, limit: int = QUOTE_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "..."


def _error_lines(text: str) -> list[str]:
    lines = [line.strip() for line in (text or "").splitlines()]
    return [line for line in lines if line and ERROR_LINE_RE.search(line) and ERROR_RE.search(line)]


def _is_path(token: str) -> bool:
    return " " not in token and ("/" in token or "." in token) and "://" not in token


def _dedupe(items: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for item in items:
        if item and item not in seen:
            seen.add(item)
            out.append(item)
    return out


def parse_sections(summary: str | None) -> dict[str, list[str]]:
    """The bullet items under each heading of a summary in the template (headings without '#')."""
    sections: dict[str, list[str]] = {}
    current: str | None = None
    for line in (summary or "").splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            current = stripped.lstrip("#").strip()
            sections.setdefault(current, [])
        elif current is not None and stripped.startswith("- ") and stripped != "- (none)":
            sections[current].append(stripped[2:])
    return sections


def _text(message: Msg) -> str:
    return media.text_of(message.content, message.content_parts)


def _collect(messages: Sequence[Msg], clearings: Mapping[int, ClearingRec]) -> dict[str, list[str]]:
    names = tool_names(messages)
    found: dict[str, list[str]] = {key: [] for key in SECTION_ITEMS}
    users = [m for m in messages if m.role == "user" and _text(m)]
    if users:
        found["Goal"].append(_quote(_text(users[0]), GOAL_CHARS))
        found["Next steps"].append("Latest request: " + _quote(_text(users[-1])))
    for message in messages:
        text = _text(message)
        found["Media"] += [
            f"{media.describe(part)} ({message.role}, message {message.id})"
            for part in message.content_parts or ()
            if media.kind_of(part)
        ]
        if message.role in ("system", "developer") and text.strip():
            found["Critical context"].append("Instructions: " + _quote(text, GOAL_CHARS))
        elif message.role == "user":
            found["Constraints and preferences"] += [
                _quote(s) for s in _sentences(text) if CONSTRAINT_RE.search(s)
            ]
        elif message.role == "assistant":
            found["Key decisions"] += [_quote(s) for s in _sentences(text) if DECISION_RE.search(s)]
            if message.tool_calls:
                found["Done"].append(_quote(describe_calls(message, CALL_CHARS), CALL_CHARS * 2))
            elif text.strip():
                found["In progress"].append(_quote(text))
        elif message.role == "tool" and message.id not in clearings:
            name = message.name or names.get(message.tool_call_id or "", "tool")
            found["Blocked"] += [f"{name}: {_quote(line)}" for line in _error_lines(text)[-2:]]
    identifiers = sorted(identifiers_of_span(messages), key=lambda t: (not _is_path(t), t))
    found["Relevant files"] = [f"`{t}`" for t in identifiers if _is_path(t)]
    found["Identifiers"] = [f"`{t}`" for t in identifiers if not _is_path(t)]
    return found


def _merge(previous: dict[str, list[str]], new: dict[str, list[str]]) -> dict[str, list[str]]:
    merged: dict[str, list[str]] = {}
    for key, limit in SECTION_ITEMS.items():
        old = previous.get(key, [])
        if key in ("In progress", "Next steps"):
            items = new[key] or old  # what is current replaces what was current
        elif key == "Goal":
            items = _dedupe(old + new[key])[:limit]  # the first goal stays first
        else:
            items = _dedupe(old + new[key])
        merged[key] = items[-limit:] if key != "Goal" else items
    return merged


def _bullets(items: Sequence[str]) -> list[str]:
    return [f"- {item}" for item in items] or ["- (none)"]


def extractive_summary(
    messages: Sequence[Msg],
    *,
    previous_summary: str | None = None,
    clearings: Mapping[int, ClearingRec] | None = None,
) -> str:
    """A summary of ``messages`` in the template, merged into ``previous_summary`` when given, and
    saying that it is extractive."""
    sections = _merge(parse_sections(previous_summary), _collect(messages, clearings or {}))
    lines = [EXTRACTIVE_NOTE, ""]
    lines += ["## Goal", *_bullets(sections["Goal"]), ""]
    lines += ["## Constraints and preferences", *_bullets(sections["Constraints and preferences"])]
    lines += ["", "## Progress", "### Done", *_bullets(sections["Done"])]
    lines += ["### In progress", *_bullets(sections["In progress"])]
    lines += ["### Blocked", *_bullets(sections["Blocked"]), ""]
    lines += ["## Key decisions", *_bullets(sections["Key decisions"]), ""]
    lines += ["## Next steps", *_bullets(sections["Next steps"]), ""]
    lines += ["## Critical context", *_bullets(sections["Critical context"])]
    lines += ["### Media", *_bullets(sections["Media"])]
    lines += ["### Identifiers", *_bullets(sections["Identifiers"]), ""]
    lines += ["## Relevant files", *_bullets(sections["Relevant files"])]
    return "\n".join(trim_text(line, QUOTE_CHARS * 2) for line in lines)
