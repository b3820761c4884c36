"""``RecapSession``: an OpenAI Agents SDK session whose history is Recap's.

    from agents import Agent, Runner
    from recap.integrations.openai_agents import RecapSession

    session = RecapSession("ticket-4711", max_input_tokens=32_000)
    result = await Runner.run(agent, "Where is my order?", session=session)

``add_items`` stores the run's items (messages, function calls and their outputs, reasoning) as
Recap messages, and enqueues ``recap.compress_session`` once per turn: after each batch that holds
a model response or a tool output (the user's input alone is not a turn). ``get_items`` returns
Recap's assembly of the branch as Responses input items: the summary, the kept history, cleared
results as placeholders, every function call followed by its output. Nothing is deleted:
``pop_item`` moves the session back one item (the next ``add_items`` starts a branch there, the
popped item stays stored on its old branch), and ``clear_session`` starts a new conversation for
the session (``<session_id>~2``, ``~3``, ...), keeping the old one with its summaries.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from recap.core.aio import AsyncRecap
from recap.core.client import Recap
from recap.core.values.limits import NAME_MAX_CHARS
from recap.convert import openai_agents as convert
from recap.integrations import _host

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings

GENERATION_MARK = "~"  # clear_session's conversations: <session_id>~2, ~3, ...


class RecapSession:
    """An Agents SDK ``Session`` stored in Recap (the ``Session`` protocol)."""

    def __init__(
        self,
        session_id: str,
        *,
        recap: Recap | AsyncRecap | None = None,
        model: str | None = None,
        max_input_tokens: int | None = None,
        instructions: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        enqueue: bool = True,
        session_settings: SessionSettings | None = None,
    ) -> None:
        """``session_id`` names the conversation (created on first use, with ``model``'s
        tokenizer and window, or ``max_input_tokens``). ``instructions`` and ``tools`` (OpenAI
        tool schemas) are what the agent sends beside the history: given, they are counted in
        the budget (they are not sent by the session; the agent sends its own). ``enqueue=False``
        leaves compression to the host."""
        if not isinstance(session_id, str) or not session_id:
            raise ValueError("session_id must be a non-empty string")
        self.session_id = session_id
        self.session_settings = session_settings
        if isinstance(recap, AsyncRecap):
            self._recap = recap
        else:
            self._recap = AsyncRecap(recap)
        self.model = model
        self.max_input_tokens = max_input_tokens
        self.instructions = instructions
        self.tools = tools
        self.enqueue = enqueue
        self._conversation: str | None = None
        self._generation = 1
        self._leaf: int | None = None  # set by pop_item: the branch ends here, not at the head
        self._lock = threading.Lock()  # the branch's end moves under it (adds, pops)

    @property
    def recap(self) -> Recap:
        return self._recap.recap

    # --- the conversation -------------------------------------------------------------------

    async def conversation_id(self) -> str:
        """The Recap conversation holding this session now (made on first use)."""
        if self._conversation is None:
            self._conversation = await self._recap.run(self._current_generation)
        return self._conversation

    def _generation_id(self, generation: int) -> str:
        if generation <= 1:
            return self.session_id
        suffix = f"{GENERATION_MARK}{generation}"
        return self.session_id[: NAME_MAX_CHARS - len(suffix)] + suffix

    def _current_generation(self) -> str:
        """The newest of the session's conversations, created when there is none."""
        generation = 1
        while _host.exists(self.recap, self._generation_id(generation + 1)):
            generation += 1
        self._generation = generation
        cid = self._generation_id(generation)
        _host.ensure_conversation(
            self.recap, cid, model=self.model, max_input_tokens=self.max_input_tokens
        )
        return cid

    # --- the protocol -----------------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """Recap's assembly of the branch as Responses input items (the latest ``limit``
        items when given, never starting with an output whose call was cut off)."""
        cid = await self.conversation_id()
        assembled = await self._recap.run(
            _host.assemble,
            self.recap,
            cid,
            leaf=self._leaf,
            system=self.instructions,
            tools=self.tools,
        )
        items = convert.messages_to_items(assembled.history)
        if limit is not None:
            items = _latest(items, limit)
        return items  # type: ignore[return-value]  # TypedDicts of the SDK, built as dicts

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Store the items as Recap messages; after a model response or tool output, enqueue
        compression."""
        if not items:
            return
        plain = [dict(item) for item in items]
        messages = convert.items_to_messages(plain)
        cid = await self.conversation_id()
        ids = await self._recap.run(self._add, cid, messages)
        if ids and self.enqueue and any(convert.is_model_output(item) for item in plain):
            await self._recap.run(_host.enqueue, self.recap, cid, None)

    def _add(self, cid: str, messages: list[dict[str, Any]]) -> list[int]:
        with self._lock:
            ids = _host.add_messages(self.recap, cid, messages, parent_id=self._leaf)
            if ids:
                self._leaf = None  # the new messages are the head
            return ids

    async def pop_item(self) -> TResponseInputItem | None:
        """Take the most recent item off the session and return it. It stays stored: the
        session's branch now ends before it, and the next ``add_items`` branches there."""
        cid = await self.conversation_id()
        popped = await self._recap.run(self._pop, cid)
        return popped  # type: ignore[return-value]  # the SDK's TypedDicts, built as dicts

    def _pop(self, cid: str) -> dict[str, Any] | None:
        with self._lock:
            return self._pop_locked(cid)

    def _pop_locked(self, cid: str) -> dict[str, Any] | None:
        stored = self.recap.export(cid, leaf=self._leaf).messages
        if not stored:
            return None
        last = stored[-1]
        message = {k: v for k, v in last.items() if k != "id"}
        items = convert.message_to_items(message)
        parent = int(stored[-2]["id"]) if len(stored) > 1 else None
        rest = items[:-1]
        if rest:  # a response with several items: the others go back as a message of their own
            kept = convert.items_to_messages(rest)
            self._leaf = self.recap.add_many(cid, kept, parent_id=parent)[-1]
        elif parent is not None:
            self._leaf = parent
        else:  # the only message: the session starts over in a conversation of its own
            self._conversation = self._new_generation()
            self._leaf = None
        return items[-1] if items else None

    async def clear_session(self) -> None:
        """Start the session over: a new, empty conversation holds it from now on (the old one
        keeps every message and summary)."""
        await self.conversation_id()
        await self._recap.run(self._clear)

    def _clear(self) -> None:
        with self._lock:
            self._conversation = self._new_generation()
            self._leaf = None

    def _new_generation(self) -> str:
        """The session's next conversation (after any another process made meanwhile)."""
        generation = self._generation
        while _host.exists(self.recap, self._generation_id(generation + 1)):
            generation += 1
        self._generation = generation + 1
        fresh = self._generation_id(self._generation)
        _host.ensure_conversation(
            self.recap, fresh, model=self.model, max_input_tokens=self.max_input_tokens
        )
        return fresh


def _latest(items: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The last ``limit`` items, without outputs at the start whose calls were cut off."""
    if limit <= 0:
        return []
    kept = items[-limit:]
    calls = {str(i.get("call_id")) for i in kept if i.get("type") == "function_call"}
    start = 0
    while (
        start < len(kept)
        and kept[start].get("type") == "function_call_output"
        and str(kept[start].get("call_id")) not in calls
    ):
        start += 1
    return kept[start:]
