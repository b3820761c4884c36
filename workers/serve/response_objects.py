"""The Responses object (pure): every field the Open Responses specification requires of a
response (``ResponseResource``), whether it is answered whole, embedded in a stream event, or
read back with ``GET /v1/responses/{id}``.

A response repeats the request's settings. What the client sent is repeated as sent (tools with
the fields the specification requires filled in: ``description``, ``parameters`` and
``strict`` are null where the tool had none); what it did not send is the value the upstream
model used by default: ``temperature`` and ``top_p`` 1, no penalties, no log probabilities, the
``default`` service tier, no truncation by the service (Recap fits the window itself, and says
so in the ``X-Recap-*`` headers).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

DEFAULT_TEMPERATURE = 1.0  # OpenAI's and the Open Responses default, the upstream's when unsent
DEFAULT_TOP_P = 1.0  # likewise
DEFAULT_SERVICE_TIER = "default"
# The request fields a response repeats as sent (after ``tools``, ``text`` and ``reasoning``,
# which are normalized first), with the value it repeats when the request had none.
REPEATED: dict[str, Any] = {
    "instructions": None,
    "previous_response_id": None,
    "tool_choice": "auto",
    "truncation": "disabled",
    "parallel_tool_calls": True,
    "temperature": DEFAULT_TEMPERATURE,
    "top_p": DEFAULT_TOP_P,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "top_logprobs": 0,
    "max_output_tokens": None,
    "max_tool_calls": None,
    "service_tier": DEFAULT_SERVICE_TIER,
    "safety_identifier": None,
    "prompt_cache_key": None,
}
FINAL_STATUSES = frozenset({"completed"})  # statuses that carry ``completed_at``


def echo(body: Mapping[str, Any]) -> dict[str, Any]:
    """What of a Responses request its response repeats: the given fields, tools as sent with
    the specification's required fields filled in, ``text`` and ``reasoning`` as objects."""
    out = {k: body[k] for k in REPEATED if body.get(k) is not None}
    tools = body.get("tools")
    if isinstance(tools, list):
        out["tools"] = [echoed_tool(tool) for tool in tools if isinstance(tool, Mapping)]
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping):
        out["metadata"] = dict(metadata)
    text = body.get("text")
    if isinstance(text, Mapping):
        out["text"] = echoed_text(text)
    reasoning = body.get("reasoning")
    if isinstance(reasoning, Mapping):
        out["reasoning"] = {
            "effort": reasoning.get("effort"),
            "summary": reasoning.get("summary"),
        }
    return out


def echoed_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A function tool as sent, with ``description``, ``parameters`` and ``strict`` (required
    of an echoed tool) null where it had none."""
    return {"description": None, "parameters": None, "strict": None, **tool}


def echoed_text(text: Mapping[str, Any]) -> dict[str, Any]:
    """``text`` as sent: its format (plain text when it named none) and its verbosity."""
    form = text.get("format")
    out: dict[str, Any] = {"format": {"type": "text"}}
    if isinstance(form, Mapping) and form.get("type") == "json_schema":
        out["format"] = {
            "type": "json_schema",
            "name": form.get("name"),
            "description": form.get("description"),
            "schema": form.get("schema"),
            "strict": bool(form.get("strict", False)),
        }
    elif isinstance(form, Mapping) and form.get("type") in ("text", "json_object"):
        out["format"] = {"type": form["type"]}
    if text.get("verbosity") is not None:
        out["verbosity"] = text["verbosity"]
    return out


def resource(  # noqa: PLR0913 - the response's parts, each named by the specification
    *,
    response_id: str,
    model: str,
    created_at: int,
    echoed: Mapping[str, Any],
    store: bool,
    output: list[dict[str, Any]],
    status: str,
    usage: dict[str, Any] | None = None,
    incomplete: str | None = None,
    error: dict[str, Any] | None = None,
    completed_at: int | None = None,
) -> dict[str, Any]:
    """The whole response object: every field ``ResponseResource`` requires, in its order."""
    if completed_at is None and status in FINAL_STATUSES:
        completed_at = int(time.time())
    repeated = {k: echoed.get(k, default) for k, default in REPEATED.items()}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "completed_at": completed_at if status in FINAL_STATUSES else None,
        "status": status,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "model": model,
        "previous_response_id": repeated.pop("previous_response_id"),
        "instructions": repeated.pop("instructions"),
        "output": output,
        "error": error,
        "tools": [dict(t) for t in echoed.get("tools") or ()],
        "tool_choice": repeated.pop("tool_choice"),
        "truncation": repeated.pop("truncation"),
        "parallel_tool_calls": repeated.pop("parallel_tool_calls"),
        "text": dict(echoed.get("text") or {"format": {"type": "text"}}),
        "top_p": repeated.pop("top_p"),
        "presence_penalty": repeated.pop("presence_penalty"),
        "frequency_penalty": repeated.pop("frequency_penalty"),
        "top_logprobs": repeated.pop("top_logprobs"),
        "temperature": repeated.pop("temperature"),
        "reasoning": echoed.get("reasoning"),
        "usage": usage,
        "max_output_tokens": repeated.pop("max_output_tokens"),
        "max_tool_calls": repeated.pop("max_tool_calls"),
        "store": store,
        "background": False,
        "service_tier": repeated.pop("service_tier"),
        "metadata": dict(echoed.get("metadata") or {}),
        "safety_identifier": repeated.pop("safety_identifier"),
        "prompt_cache_key": repeated.pop("prompt_cache_key"),
    }
