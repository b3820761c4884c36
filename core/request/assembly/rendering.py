"""Stored messages as a request sends them: in the state their clearings record (full, aged,
cleared, shortened, their arguments shortened), with the reasoning the provider takes back, and
with call ids made unique when a server numbered them per turn."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from recap.core.counting import reasoning, tokens
from recap.core.decision.toolresults import shortened_call
from recap.core.request import refs, shorten
from recap.core.request.assembly.given import Given
from recap.core.request.placeholders import RECALL_TOOL, cleared_placeholder
from recap.core.values.draft import Unit
from recap.core.values.records import ClearingRec, Msg


def render_stored(
    message: Msg,
    clearings: Mapping[int, ClearingRec],
    encoding: str,
    missing_outputs: Collection[str] = frozenset(),
) -> dict[str, Any]:
    """One stored message as a request sends it in the state ``clearings`` records for it
    (full, aged, cleared, shortened, its arguments shortened): what the cache benchmark prices."""
    return render(message, clearings, missing_outputs, encoding)


def render(
    item: Msg | dict[str, Any],
    clearings: Mapping[int, ClearingRec],
    missing_outputs: Collection[str],
    encoding: str,
    *,
    recall: bool = False,
) -> dict[str, Any]:
    """One OpenAI-format message; a cleared tool result says its fixed placeholder instead
    (naming ``recap_recall`` when ``recall``: the request offers it), a
    shortened or aged one its head and tail at the size its clearing recorded; an assistant
    message whose arguments aged sends its calls shortened."""
    if isinstance(item, dict):
        return item
    out = item.to_openai()
    if item.role == "assistant" and item.tool_calls:
        calling = clearings.get(item.id)
        if calling is not None and calling.arguments_tokens:
            ref = refs.message_ref(item.id)
            out["tool_calls"] = [shortened_call(call, ref) for call in item.tool_calls]
        return out
    clearing = clearings.get(item.id) if item.role == "tool" else None
    if clearing is not None and clearing.aged:
        out["content"] = shorten.aged_text(
            tokens.content_text(out.get("content")),
            keep=item.tokens - clearing.tokens_reclaimed,
            max_chars=clearing.kept_chars or shorten.DEFAULT_AGED_CHARS,
            frame=tokens.count_message({**out, "content": ""}, encoding),
            encoding=encoding,
            ref=refs.message_ref(item.id),
            path=item.output_path,
            file_exists=item.output_path not in missing_outputs,
        )
    elif clearing is not None and clearing.reason == shorten.SHORTENED:
        out["content"] = shorten.head_and_tail(
            tokens.content_text(out.get("content")),
            item.tokens - clearing.tokens_reclaimed,
            encoding,
            path=item.output_path if item.output_path not in missing_outputs else None,
        )
    elif clearing is not None:
        out["content"] = cleared_placeholder(
            tool_name=item.name,
            call_id=item.tool_call_id or "",
            tokens=item.tokens,
            output_path=item.output_path,
            file_exists=item.output_path not in missing_outputs,
            ref=refs.message_ref(item.id),
            recall=recall,
        )
    return out


def offers_recall(tools: Sequence[Mapping[str, Any]] | None) -> bool:
    """Whether the request's tools include ``recap_recall`` (OpenAI's schema, or a flat one)."""
    for tool in tools or ():
        function = tool.get("function")
        name = function.get("name") if isinstance(function, Mapping) else tool.get("name")
        if name == RECALL_TOOL:
            return True
    return False


def extend(
    messages: list[dict[str, Any]],
    units: Sequence[Unit],
    given: Given,
    clearings: Mapping[int, ClearingRec],
    *,
    in_progress: bool,
    marks: list[int] | None = None,
) -> None:
    """Add the units' messages as sent under ``clearings`` to ``messages``, with the reasoning
    the provider takes back and no other; the positions of pinned messages go into ``marks``
    (when given)."""
    missing, encoding, pins = given.stored.missing_outputs, given.encoding, given.pins
    family, text_only, model = given.family, given.request.text_only, given.target.model
    recall = offers_recall(given.request.tools)
    for unit in units:
        for item in unit.items:
            out = render(item, clearings, missing, encoding, recall=recall)
            if isinstance(item, Msg) and (item.extra or item.content_parts):
                out = reasoning.as_sent(
                    out, family, in_progress=in_progress, text_only=text_only, model=model
                )
            if marks is not None and unit.pinned and isinstance(item, Msg) and item.id in pins:
                marks.append(len(messages))
            messages.append(out)


def unique_call_ids(messages: list[dict[str, Any]], encoding: str) -> int:
    """Give each call id already used earlier in ``messages`` a fresh one, with the results that
    answer it (new dicts, in place in the list); the tokens this adds.

    Some servers number calls per turn (``call_0`` on every turn), and a provider that requires
    unique ids (Anthropic) rejects a request that repeats one. The first use keeps its id, a
    later one becomes ``<id>_<n>``: this depends on the request alone, so the same state gives
    the same bytes. Results follow their call (``units``), so each takes the next id given to
    a call of the same stored id in the assistant message before it.
    """
    seen: set[str] = set()
    given: dict[str, list[str]] = {}
    added = 0
    for position, message in enumerate(messages):
        renamed = None
        if message.get("tool_calls"):
            given = {}
            calls = []
            for call in message["tool_calls"]:
                stored = new = str(call.get("id", ""))
                uses = 1
                while new in seen:
                    uses += 1
                    new = f"{stored}_{uses}"
                seen.add(new)
                given.setdefault(stored, []).append(new)
                calls.append(call if new == stored else {**call, "id": new})
            if any(new is not old for new, old in zip(calls, message["tool_calls"], strict=True)):
                renamed = {**message, "tool_calls": calls}
        elif message.get("role") == "tool" and given.get(str(message.get("tool_call_id"))):
            new = given[str(message["tool_call_id"])].pop(0)
            if new != message["tool_call_id"]:
                renamed = {**message, "tool_call_id": new}
        if renamed is not None:
            added += tokens.count_message(renamed, encoding)
            added -= tokens.count_message(message, encoding)
            messages[position] = renamed
    return added
