"""Provider formats of an assembled request (pure): stub results, text-only tool turns, cache marks.

The request view is built in OpenAI's structured format. Two renderings adapt it:

- **text-only**, for providers or models without tool roles: an assistant tool call becomes
  assistant text naming the tool, its call id and its arguments, and the results of one call group
  become one user message, so agent runs still alternate assistant / user;
- **cache breakpoints**, Anthropic style: a ``cache_control`` mark on the last message of the
  stable prefix, which litellm passes on to providers that cache prompts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from core.counting.tokens import content_text

NO_RESULT_TEXT = "[No result was recorded for this tool call.]"
CACHE_CONTROL: dict[str, str] = {"type": "ephemeral"}  # Anthropic's only cache type


def stub_result(call: Mapping[str, Any]) -> dict[str, Any]:
    """The tool result that answers a call whose own result was never recorded (or left out)."""
    function = call.get("function") or {}
    return {
        "role": "tool",
        "content": NO_RESULT_TEXT,
        "tool_call_id": str(call.get("id", "")),
        "name": str(function.get("name", "")),
    }


def text_only_call(message: Mapping[str, Any]) -> dict[str, Any]:
    """An assistant message with tool calls, as plain assistant text."""
    lines = [content_text(message.get("content"))] if message.get("content") else []
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        lines.append(
            f"[Tool call {call.get('id', '')}: {function.get('name', '')} "
            f"{function.get('arguments', '')}]"
        )
    return {"role": "assistant", "content": "\n".join(lines)}


def text_only_results(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The results of one call group, as a single user message."""
    blocks = [
        f"[Tool result {r.get('tool_call_id', '')} ({r.get('name') or 'tool'})]\n"
        f"{content_text(r.get('content'))}"
        for r in results
    ]
    return {"role": "user", "content": "\n\n".join(blocks)}


def with_cache_mark(message: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the message whose last content block carries an Anthropic cache breakpoint."""
    out = dict(message)
    content = message.get("content")
    if isinstance(content, list) and content and isinstance(content[-1], dict):
        blocks = [dict(block) if isinstance(block, dict) else block for block in content]
        blocks[-1]["cache_control"] = dict(CACHE_CONTROL)
    else:
        text = content_text(content)
        blocks = [{"type": "text", "text": text, "cache_control": dict(CACHE_CONTROL)}]
    out["content"] = blocks
    return out
