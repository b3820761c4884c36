"""Native items through the Python API: a host on the OpenAI or Anthropic SDK keeps the items
Recap cannot read (encrypted reasoning, compaction items, signed thinking, built-in tool items)
through Recap, as ``recap serve``'s native dialects do.

Store a reply with ``responses_reply`` (or ``anthropic_reply``): the assistant message Recap
reads, with every other item kept as a provider item of that provider and model. Assemble for
the model you call (``recap.assemble(cid, model=...)``): its items come back on the messages
(another model's are left out, reasoning past ``RECAP_THINKING_TURNS`` is cleared). Turn the
assembled messages into the SDK's input with ``responses_input`` (or ``anthropic_input``):
each item at its place, as the provider wrote it.

    reply = client.responses.create(model="gpt-5", input=items, instructions=instructions,
                                    store=False, include=["reasoning.encrypted_content"])
    recap.add(cid, [recap_native.responses_reply(reply, "openai/gpt-5")])
    assembled = recap.assemble(cid, model="openai/gpt-5")
    instructions, items = recap_native.responses_input(assembled.messages, "openai/gpt-5")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from recap.core.request import native_anthropic, native_openai
from recap.core.request.native_items import Report

__all__ = ["Report", "anthropic_input", "anthropic_reply", "responses_input", "responses_reply"]


def _data(reply: Any) -> Mapping[str, Any]:
    """An SDK object (pydantic) or a dict, as its JSON object."""
    if isinstance(reply, Mapping):
        return reply
    dump = getattr(reply, "model_dump", None)
    if dump is None:
        raise TypeError(f"expected a reply object or a dict, got {type(reply).__name__}")
    data = dump(exclude_none=True, mode="json")
    if not isinstance(data, Mapping):
        raise TypeError("the reply is not a JSON object")
    return data


def responses_reply(reply: Any, model: str) -> dict[str, Any]:
    """A Responses reply (the SDK's ``Response`` or its JSON) as the message to store; ``model``
    is the model string the host assembles for (``openai/gpt-5``)."""
    return native_openai.reply_message(_data(reply), model)


def responses_input(
    messages: Sequence[Mapping[str, Any]], model: str, report: Report | None = None
) -> tuple[str, list[Any]]:
    """Assembled messages as the Responses API's ``instructions`` and ``input`` for ``model``;
    ``report`` (when given) counts the provider items sent and left out."""
    return native_openai.responses_input(messages, model, report)


def anthropic_reply(reply: Any, model: str) -> dict[str, Any]:
    """An Anthropic reply (the SDK's ``Message`` or its JSON) as the message to store."""
    return native_anthropic.reply_message(_data(reply), model)


def anthropic_input(
    messages: Sequence[Mapping[str, Any]], model: str, report: Report | None = None
) -> tuple[str, list[dict[str, Any]]]:
    """Assembled messages as the Messages API's ``system`` and ``messages`` for ``model``."""
    return native_anthropic.anthropic_input(messages, model, report)
