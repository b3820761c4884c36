"""The Agents SDK's items as Recap stores them: each stored message carries the items it stands
for, so ``RecapSession.get_items`` gives them back as the SDK stored them; and the fixed parts an
agent sends beside its history. Shared by the session (``openai_agents.py``) and its model
wrapper (``_agents_model.py``)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from recap.convert import openai_agents as convert

ORIGINAL_KEY = "agents_items"  # the SDK's items a stored message stands for, as they came
COMPARED_KEYS = ("role", "content", "tool_calls", "tool_call_id")  # what assembly may rewrite


@dataclass(frozen=True)
class FixedParts:
    """What the agent sends beside the history: counted in the budget, never sent by Recap."""

    instructions: str | None = None
    tools: tuple[dict[str, Any], ...] | None = None


def with_originals(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items as Recap messages, each carrying the items it stands for."""
    messages = convert.items_to_messages(items)
    groups: list[list[dict[str, Any]]] = [[] for _ in messages]
    for end, item in enumerate(items, start=1):  # an item belongs to the last message so far
        groups[len(convert.items_to_messages(items[:end])) - 1].append(item)
    for message in messages:  # reasoning alone (a response cut by a pop): an empty answer
        if message.get("content") is None and not message.get("tool_calls"):
            message["content"] = ""
    return [{**m, ORIGINAL_KEY: g} for m, g in zip(messages, groups, strict=True)]


def sent_whole(message: Mapping[str, Any], originals: list[Any]) -> bool:
    """Whether the assembly sends the message as the originals say (not cleared, aged,
    shortened or truncated on the way in)."""
    try:
        again = convert.items_to_messages(originals)
    except (AttributeError, TypeError, KeyError):
        return False
    if len(again) != 1:
        return False
    return all(_same(again[0].get(k), message.get(k)) for k in COMPARED_KEYS)


# a media part sent as its placeholder (``core.counting.media``: aged, or its copy gone)
AGED_MEDIA = re.compile(
    r"\[[a-z]+: [^\]\n]*, (?:removed to save context|its stored copy is no longer available)\]"
)


def media_aged(message: Mapping[str, Any], originals: list[Any]) -> bool:
    """Whether the assembly sends the message as the originals say but for media parts sent as
    placeholders (an image that cannot fit the window, even in its own turn): the same role,
    the same text, one placeholder for each media part not sent."""
    try:
        again = convert.items_to_messages(originals)
    except (AttributeError, TypeError, KeyError):
        return False
    if len(again) != 1 or again[0].get("role") != message.get("role"):
        return False
    sent, given = again[0].get("content"), message.get("content")
    if not isinstance(given, list):
        return False
    texts = [p.get("text") for p in given if isinstance(p, Mapping) and p.get("type") == "text"]
    media = len(given) - len(texts)
    kept = 0
    if isinstance(sent, list):
        kept = sum(1 for p in sent if not (isinstance(p, Mapping) and p.get("type") == "text"))
        sent = "".join(
            str(p.get("text") or "")
            for p in sent
            if isinstance(p, Mapping) and p.get("type") == "text"
        )
    if not isinstance(sent, str) or media == 0:
        return False
    aged = len(AGED_MEDIA.findall(sent))
    return (
        aged > 0 and aged + kept == media and AGED_MEDIA.sub("", sent) == "".join(map(str, texts))
    )


def _same(left: Any, right: Any) -> bool:
    if left in (None, "", []) and right in (None, "", []):
        return True
    return bool(json.dumps(left, sort_keys=True) == json.dumps(right, sort_keys=True))
