"""Per-message content hashes: how a client's resent history is recognized as stored messages.

A hash covers what a message says as the client sent or received it (role, content, tool calls,
the call a result answers, a name), never how Recap stores or renders it: a tool output that was
truncated on the way in, cleared later or covered by a summary keeps the hash of what the client
sent. Keys that change with the client rather than the message (``id``, ``refusal: null``,
``annotations``, ``cache_control`` breakpoints that move every turn, the provider's reasoning) are
left out, and ``content: null`` equals ``content: ""``, so a reply resent by any SDK matches the
one Recap stored.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

HASH_CHARS = 32  # 128 bits of SHA-256: collisions are out of reach, and the index key stays short
MOVING_PART_KEYS = frozenset({"cache_control"})  # breakpoint markers a client moves every turn


def _content(content: Any) -> Any:
    """A string as is; a list holding one text part as its text; other lists without the keys
    that move between turns."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        if (
            len(content) == 1
            and isinstance(content[0], Mapping)
            and content[0].get("type") == "text"
        ):
            return str(content[0].get("text", ""))
        return [
            {k: v for k, v in part.items() if k not in MOVING_PART_KEYS}
            if isinstance(part, Mapping)
            else part
            for part in content
        ]
    return str(content)


def _calls(calls: Any) -> list[list[str]]:
    out: list[list[str]] = []
    for call in calls or ():
        if not isinstance(call, Mapping):
            continue
        function = call.get("function") or {}
        out.append(
            [
                str(call.get("id", "")),
                str(function.get("name", "")),
                str(function.get("arguments") or ""),
            ]
        )
    return out


def normalized(message: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a message its hash covers, in one canonical shape."""
    out: dict[str, Any] = {
        "role": str(message.get("role", "")),
        "content": _content(message.get("content")),
    }
    calls = _calls(message.get("tool_calls"))
    if calls:
        out["tool_calls"] = calls
    for key in ("tool_call_id", "name"):
        value = message.get(key)
        if value:
            out[key] = str(value)
    return out


def message_hash(message: Mapping[str, Any]) -> str:
    """The content hash of an OpenAI-format message (hex, ``HASH_CHARS`` long)."""
    text = json.dumps(
        normalized(message), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:HASH_CHARS]
