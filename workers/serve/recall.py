"""``RECAP_SERVE_RECALL=true``: `recap serve` offers the model the ``recap_recall`` tool and
answers its calls itself, so the client never sees them.

A stored, non-streamed turn is sent upstream with ``recap_recall`` beside the client's tools
(``assemble`` counts it as one of the request's tools). When the reply calls it, serve answers
each call from the conversation (``core.recall.answer``), appends the call and its results to the
request, and asks again; at most ``RECAP_SERVE_RECALL_MAX_CALLS`` calls a turn are answered, each
within the room the window has left, and the round after the last answer goes out without the
tool, so the model has to reply. Only the final reply reaches the client and is stored; the
recall exchange is not stored (the client never sends it back), and the usage recorded is the
first round's, whose request is the one Recap assembled and counted. A streamed turn is sent as
it is, without the tool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from recap.core import recall
from recap.core.counting import tokens
from recap.core.settings import Settings
from recap.workers.serve import metrics, upstream
from recap.workers.serve.replies import Reply

if TYPE_CHECKING:
    from recap.workers.serve.turns import Turn, Turns

log = structlog.get_logger(__name__)
CHARS_PER_TOKEN = 2  # a recalled page's room in characters per token left: an underestimate
MIN_PAGE_CHARS = 200  # with less room than this, the call is answered that no room is left
NO_ROOM = "[recap_recall: the context window has no room left for recalled content this turn]"
LIMIT = "[recap_recall: the limit of {n} recalls a turn is reached; answer with what you have]"


def enabled(settings: Settings, stream: bool) -> bool:
    """Whether this turn offers the tool and answers its calls."""
    return settings.serve_recall and not stream


def tools_for(
    tools: list[dict[str, Any]] | None, settings: Settings
) -> list[dict[str, Any]] | None:
    """The tools a stored turn is assembled (and counted) with: the client's, and
    ``recap_recall`` when serve answers it."""
    if not settings.serve_recall:
        return tools
    return [*(tools or []), recall.tool_schema()]


def recall_calls(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ``recap_recall`` calls of a reply message."""
    return [
        dict(call)
        for call in message.get("tool_calls") or ()
        if (call.get("function") or {}).get("name") == recall.RECALL_TOOL_NAME
    ]


async def call_with_recall(turns: Turns, turn: Turn) -> Reply:
    """The turn's final reply: upstream rounds, each ``recap_recall`` call answered here."""
    settings = turns.settings
    plain = dict(turn.params)
    turn.params = {**plain, "tools": [*(plain.get("tools") or []), recall.tool_schema()]}
    response = await turns.call_once(turn, stream=False)  # compresses, retries on overflow
    assert isinstance(response, Reply), "a chat-completions turn's whole reply"
    turn.usage_response = response
    messages = list(turn.sent)
    room = turn.room
    answered = 0
    limit = settings.serve_recall_max_calls
    encoding = tokens.encoding_name_for(turn.model)
    while True:
        try:  # a round's reply is checked as the final one is: malformed, a 502
            message = upstream.reply_message(response)
        except upstream.MalformedReply as exc:
            raise upstream.as_serve_error(exc, settings) from None
        calls = recall_calls(message)
        if not calls:
            return response
        results: list[dict[str, Any]] = []
        for call in calls:
            if answered >= limit:
                text = LIMIT.format(n=limit)
            elif room * CHARS_PER_TOKEN < MIN_PAGE_CHARS:
                text = NO_ROOM
            else:
                cap = min(settings.recall_max_chars, room * CHARS_PER_TOKEN)
                text = await turns.recap.run(
                    recall.answer,
                    turns.recap.recap.engine,
                    turn.conversation_id,
                    (call.get("function") or {}).get("arguments") or "{}",
                    settings,
                    max_chars=cap,
                )
                # the conversation as the client names it, never the id it is stored under
                text = text.replace(turn.conversation_id, turn.name)
                answered += 1
                metrics.recall_answered()
            result = {"role": "tool", "tool_call_id": call.get("id"), "content": text}
            room -= tokens.count_message(result, encoding)
            results.append(result)
        asked = {"role": "assistant", "content": message.get("content") or "", "tool_calls": calls}
        room -= tokens.count_message(asked, encoding)
        messages += [asked, *results]
        log.info(
            "serve_recall_answered",
            conversation_id=turn.conversation_id,
            calls=len(calls),
            answered=answered,
            room=room,
        )
        params = turn.params if answered < limit else plain
        response = await _complete(turns, turn, messages, params)


async def _complete(
    turns: Turns, turn: Turn, messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any]
) -> Reply:
    try:
        return await turns.upstream.complete(turn.model, messages, params, stream=False)
    except Exception as exc:
        raise upstream.as_serve_error(exc, turns.settings) from None
