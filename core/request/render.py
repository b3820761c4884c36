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

from recap.core.counting.tokens import content_text

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


def alternated(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages with neighbours of one role merged into one turn, so that after the system
    prompt user and assistant turns strictly alternate (a summary, context files, a gap note or
    a reminder beside a user turn is otherwise a second user turn in a row, which providers
    without tool roles reject or fold). A message that is already alone is passed as it is."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if out and out[-1].get("role") == role and role in ("user", "assistant"):
            out[-1] = {
                **out[-1],
                "content": _joined(out[-1].get("content"), message.get("content")),
            }
        else:
            out.append(dict(message))
    return out


def _joined(first: Any, second: Any) -> Any:
    if isinstance(first, list) or isinstance(second, list):
        return [*_parts(first), *_parts(second)]
    return f"{first or ''}\n\n{second or ''}"


def _parts(content: Any) -> list[Any]:
    if isinstance(content, list):
        return list(content)
    return [{"type": "text", "text": content or ""}]


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
