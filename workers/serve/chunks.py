"""What a streamed chat-completions chunk says beside its delta (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def chunk_usage(chunk: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """The (prompt, completion, cached) tokens a usage chunk reports; None when it reports none."""
    usage = chunk.get("usage")
    if not isinstance(usage, Mapping) or usage.get("prompt_tokens") is None:
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else 0
    return (
        int(usage["prompt_tokens"]),
        int(usage.get("completion_tokens") or 0),
        int(cached or 0),
    )
