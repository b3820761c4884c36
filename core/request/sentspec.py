"""What a request was given beside the stored history, as text to store and read back (pure).

The worker builds the summarizer's request on the chat's own prefix (``core.compression.prefix``):
it assembles the chat's last request again, which needs the system prompt, tool schemas, reminder
and rendering that request was given. ``encode`` gives them as one JSON text and its hash (the
request path compares the hash with the stored one and writes only when it changed); ``decode``
gives back the ``RequestSpec``. Context files and ``as_of`` are not kept: a request given context
files is not rebuilt (its recorded state says so, and the summarizer keeps its own request shape).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from recap.core.values.request import RequestSpec

VERSION = 1  # the layout of the stored JSON; another layout reads as nothing stored


def encode(spec: RequestSpec) -> tuple[str, str]:
    """The JSON text of what ``spec`` gives beside the history, and its hash."""
    value: dict[str, Any] = {
        "v": VERSION,
        "system": spec.system,
        "tools": list(spec.tools) if spec.tools is not None else None,
        "reminder": spec.reminder,
        "text_only": spec.text_only,
        "cache_breakpoints": spec.cache_breakpoints,
        "model": spec.model,
        "max_input_tokens": spec.max_input_tokens,
        "user_id": spec.user_id,
    }
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text, hashlib.sha256(text.encode()).hexdigest()


def decode(text: str | None) -> RequestSpec | None:
    """The ``RequestSpec`` ``encode`` stored, or None (nothing stored, or not readable)."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("v") != VERSION:
        return None
    tools = value.get("tools")
    return RequestSpec(
        system=value.get("system"),
        tools=tuple(tools) if isinstance(tools, list) else None,
        reminder=value.get("reminder"),
        text_only=bool(value.get("text_only")),
        cache_breakpoints=value.get("cache_breakpoints"),
        model=value.get("model"),
        max_input_tokens=value.get("max_input_tokens"),
        user_id=value.get("user_id"),
    )
