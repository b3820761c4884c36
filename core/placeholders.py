"""The fixed text a cleared tool result renders as (pure: the same state gives the same bytes)."""

from __future__ import annotations

EXPORT_HINT = "recap export {conversation_id} --full"


def cleared_placeholder(
    *,
    tool_name: str | None,
    call_id: str,
    tokens: int,
    output_path: str | None = None,
    file_exists: bool = True,
) -> str:
    """What a cleared tool result says instead of its output: the tool, the call, the size that
    was there, and how to get it back (the saved file, or that it has expired)."""
    tool = tool_name or "tool"
    head = f"[Cleared: the output of {tool} (call {call_id}, {tokens} tokens) was removed to save context."
    if output_path and file_exists:
        return f"{head} The full output is saved at {output_path}; read that file if you need it.]"
    if output_path:
        return f"{head} Its saved full output has expired; run the tool again if you need it.]"
    return f"{head} Run the tool again if you need its output.]"
