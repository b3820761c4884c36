"""``RecapSession``: an OpenAI Agents SDK session whose history is Recap's.

    from agents import Agent, Runner
    from recap.integrations.openai_agents import RecapSession

    session = RecapSession("ticket-4711", max_input_tokens=32_000)
    agent = Agent(name="support", model=session.wrap("gpt-4o-mini"))
    result = await Runner.run(agent, "Where is my order?", session=session)

``add_items`` stores the run's items as Recap messages, each message with the items it stands for
exactly as the SDK gave them (``agents_items``: types, ids, parts, reasoning with its encrypted
content), and enqueues ``recap.compress_session`` after each batch that holds a model response or
a tool output. ``get_items`` returns Recap's assembly of the conversation: each message sent in
full as its original items, the summary and cleared or shortened results as Recap renders them.

``session.wrap(model)`` wraps the agent's model so that every model call is Recap's: the request's
history is assembled at that call with the agent's real system prompt, tool schemas and output
reserve, the provider's usage is recorded against it, and a context-length error is answered by
compressing now and retrying once (``RecapModel``). Without it the
session still records the usage of each run's first model call, whose request it assembled.

Nothing is deleted. ``pop_item`` moves the end of the conversation's branch back one item (kept in
the conversation's meta, so every session object and process sees it; the item stays stored on
its old branch, and the next ``add_items`` branches there); ``clear_session`` starts a new
conversation for the session (``<session_id>~2``, ``~3``, ...), keeping the old one.
"""

from __future__ import annotations

import json
import threading
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from recap.convert import openai_agents as convert
from recap.core.aio import AsyncRecap
from recap.core.client import Recap
from recap.core.errors import InputError
from recap.core.request.render import NO_RESULT_TEXT
from recap.core.settings import Settings
from recap.core.values.limits import NAME_MAX_CHARS
from recap.integrations import _host
from recap.integrations._agents_items import (
    ORIGINAL_KEY,
    FixedParts,
    sent_whole,
    with_originals,
)

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings
    from agents.models.interface import Model

    from recap.integrations._agents_model import RecapModel

GENERATION_MARK = "~"  # clear_session's conversations: <session_id>~2, ~3, ...
LEAF_KEY = "agents_branch_end"  # conversation meta: where pop_item left the branch's end
RUNS_REMEMBERED = 64  # runs whose usage readings are tracked at once (one per run in flight)
LOCK_STRIPES = 64  # locks shared by all conversations: a bounded set, however many there are
_LOCKS = tuple(threading.Lock() for _ in range(LOCK_STRIPES))


def _conversation_lock(conversation_id: str) -> threading.Lock:
    """The process's lock for the conversation's branch end (one of ``LOCK_STRIPES``)."""
    return _LOCKS[zlib.crc32(conversation_id.encode()) % LOCK_STRIPES]


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
        session_settings: SessionSettings | Mapping[str, Any] | None = None,
        user_id: str | None = None,
    ) -> None:
        """``session_id`` names the conversation (created on first use, with ``model``'s
        tokenizer and window, or ``max_input_tokens``). ``instructions`` and ``tools`` (OpenAI
        tool schemas) are counted in the budget until a model wrapped by ``wrap()`` hands the
        agent's own. ``session_settings`` is a ``SessionSettings`` or a dict of its fields
        (default ``SessionSettings()``). ``enqueue=False`` leaves compression to the host.
        ``user_id`` names the user whose memory the requests carry (docs/memory.md)."""
        from agents.memory.session_settings import SessionSettings, coerce_session_settings

        if not isinstance(session_id, str) or not session_id:
            raise ValueError("session_id must be a non-empty string")
        self.session_id = session_id
        self.session_settings: SessionSettings = (
            SessionSettings()
            if session_settings is None
            else coerce_session_settings(session_settings)  # type: ignore[arg-type]
        )
        self._owned = recap is None  # made here: ``close`` disposes of it
        self._recap = recap if isinstance(recap, AsyncRecap) else AsyncRecap(recap)
        self.model = model
        self.max_input_tokens = max_input_tokens
        self.fixed = FixedParts(instructions, tuple(tools) if tools is not None else None)
        self.enqueue = enqueue
        self.user_id = user_id
        self._generation = 1
        self._reserve: int | None = None  # the output reserve last set on the conversation
        # id(run context) -> (usage readings seen, the leaf of the request assembled for its
        # next model call): one entry per run in flight
        self._runs: dict[int, tuple[int, int | None]] = {}
        self._model_records = False  # a wrapped model records every call itself
        self._subs: list[RecapSession] = []  # sub-agents' sessions attached as they grow

    # --- sub-agents ---------------------------------------------------------------------------

    def attach_sub_agent(self, sub: RecapSession) -> None:
        """Attach ``sub``'s conversation (a sub-agent's session) to this one each time this
        session stores items after the sub-agent's run grew it: the parent's later requests
        carry the sub-agent's work, between markers, once (``Recap.attach``)."""
        if sub is self:
            raise ValueError("a session cannot attach itself")
        if sub not in self._subs:
            self._subs.append(sub)

    async def attach(self, source: RecapSession | str, *, leaf: int | None = None) -> Any:
        """Attach another session's conversation (or a conversation id) after this one's head
        now (``Recap.attach``)."""
        cid = await self.conversation_id()
        name = await source.conversation_id() if isinstance(source, RecapSession) else source
        return await self._recap.attach(cid, source=name, leaf=leaf)

    def _attach_subs(self, cid: str) -> None:
        """Attach each registered sub-agent session that grew since (an empty one, or one whose
        head is attached already, is refused and skipped; so is a head waiting for tool
        results: the next store tries again)."""
        for sub in self._subs:
            source = sub._current()
            try:
                self.recap.attach(cid, source=source, leaf=sub.branch_end(source))
            except InputError:
                continue

    @property
    def recap(self) -> Recap:
        return self._recap.recap

    def wrap(self, inner: Model | str) -> RecapModel:
        """The agent's model (a ``Model`` or an OpenAI model name) with every call assembled by
        Recap, its usage recorded and a context-length error compressed away once."""
        from recap.integrations._agents_model import RecapModel

        return RecapModel(inner, self)

    def close(self) -> None:
        """Dispose of the database engine, when the session made its own ``Recap``."""
        if self._owned:
            self.recap.engine.dispose()

    # --- the conversation -------------------------------------------------------------------

    async def conversation_id(self) -> str:
        """The Recap conversation holding this session now (made on first use)."""
        return await self._recap.run(self._current)

    def _generation_id(self, generation: int) -> str:
        if generation <= 1:
            return self.session_id
        suffix = f"{GENERATION_MARK}{generation}"
        return self.session_id[: NAME_MAX_CHARS - len(suffix)] + suffix

    def _current(self) -> str:
        """The newest of the session's conversations (another object or process may have
        cleared the session since), created when there is none."""
        generation = self._generation
        while _host.exists(self.recap, self._generation_id(generation + 1)):
            generation += 1
        self._generation = generation
        cid = self._generation_id(generation)
        self._ensure(cid)
        return cid

    def _ensure(self, cid: str) -> None:
        _host.ensure_conversation(
            self.recap, cid, model=self.model, max_input_tokens=self.max_input_tokens
        )

    # --- the protocol -----------------------------------------------------------------------

    async def get_items(
        self, limit: int | None = None, *, wrapper: Any = None
    ) -> list[TResponseInputItem]:
        """Recap's assembly of the conversation as the SDK's items: the latest ``limit`` (or
        ``session_settings.limit``) when given, as the SDK's sessions give them (the runner
        drops an output whose call was cut off)."""
        from agents.memory.session_settings import resolve_session_limit

        limit = resolve_session_limit(limit, self.session_settings)
        items = await self._recap.run(self._read)
        if limit is not None:
            items = items[-limit:] if limit > 0 else []
        return items  # type: ignore[return-value]  # the SDK's TypedDicts, as stored

    def _read(self) -> list[dict[str, Any]]:
        cid = self._current()
        history = self._assemble(cid, self.branch_end(cid)).history
        while history and _repaired(history[-1]):  # a pop left the calls' outputs behind
            history = history[:-1]
        return self.items_of(history)

    def _assemble(self, cid: str, leaf: int | None, *, compress: bool = False) -> _host.Assembled:
        """Recap's request at ``leaf``; with ``compress``, compressed first whatever Recap's own
        count says (the provider refused it: resending it as it was would fail again)."""
        if compress:
            self.recap.compress(cid, leaf=leaf, force=True)
        tools = list(self.fixed.tools) if self.fixed.tools is not None else None
        return _host.assemble(
            self.recap,
            cid,
            leaf=leaf,
            system=self.fixed.instructions,
            tools=tools,
            user_id=self.user_id,
        )

    def items_of(self, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Assembled messages as items: a message sent as it was stored gives back the SDK's
        original items; a summary, a placeholder or a shortened result is converted."""
        items: list[dict[str, Any]] = []
        for message in history:
            originals = message.get(ORIGINAL_KEY)
            plain = {k: v for k, v in message.items() if k != ORIGINAL_KEY}
            if isinstance(originals, list) and sent_whole(plain, originals):
                items.extend(json.loads(json.dumps(originals)))
            else:
                items.extend(convert.message_to_items(plain))
        return items

    async def add_items(self, items: list[TResponseInputItem], *, wrapper: Any = None) -> None:
        """Store the items (each message with its original items); after a model response or
        tool output, record the run's usage reading and enqueue compression."""
        if not items:
            return
        plain = [json.loads(json.dumps(item)) for item in items]
        cid = await self._recap.run(self._add, plain, wrapper)
        if self._subs:
            await self._recap.run(self._attach_subs, cid)
        if self.enqueue and any(convert.is_model_output(item) for item in plain):
            await self._recap.run(_host.enqueue, self.recap, cid, None, self.user_id)

    def _add(self, plain: list[dict[str, Any]], wrapper: Any) -> str:
        cid = self._current()
        with _conversation_lock(cid):
            end = self.branch_end(cid)
            messages = self._stored_form(plain)
            ids = _host.add_messages(self.recap, cid, messages, parent_id=end)
            if end is not None:  # the new messages are the head: the branch ends there
                self.recap.set_meta(cid, LEAF_KEY, None)
        if wrapper is None or not ids:
            return cid
        readings, measured = self._run_state(wrapper)
        if readings and measured is not None and not self._model_records:
            self.record(cid, measured, readings[0])  # the run's first call: Recap's request
        measured = None
        if not self._model_records and not any(convert.is_model_output(i) for i in plain):
            # the run's input: the SDK sends the history it read and this input, which Recap
            # assembles now, so that the call's usage is compared with that very request
            measured = self._measure(cid, ids[-1])
        self._runs[id(wrapper)] = (self._seen(wrapper), measured)
        return cid

    def _stored_form(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The items as messages with their originals, except where ingest will cut the message
        (a large tool output, call arguments or inline media go to a file): the row keeps the
        preview alone, and the item comes back converted from it."""
        settings = self.recap.settings
        messages = with_originals(items)
        for message in messages:
            if _cut_on_ingest(message, settings):
                del message[ORIGINAL_KEY]
        return messages

    def _measure(self, cid: str, leaf: int) -> int | None:
        try:
            self._assemble(cid, leaf)
        except Exception as exc:  # a request that cannot be built is the model call's to report
            _host.log.warning("assemble failed for %s: %s", cid, exc)
            return None
        return leaf

    def _run_state(self, wrapper: Any) -> tuple[list[Any], int | None]:
        """The usage readings of the run's model calls since its last ``add_items``, and the
        leaf of the request Recap assembled for the first of them."""
        entries = _entries(wrapper)
        seen, measured = self._runs.get(id(wrapper), (0, None))
        if len(self._runs) >= RUNS_REMEMBERED and id(wrapper) not in self._runs:
            self._runs.clear()
        return list(entries[seen:]), measured

    @staticmethod
    def _seen(wrapper: Any) -> int:
        return len(_entries(wrapper))

    def record(self, cid: str, leaf: int, usage: Any) -> None:
        """Store one model call's usage (input, output, cached tokens) for the request Recap
        assembled at ``leaf``; a failure is logged, never raised into the run."""
        reading = usage_numbers(usage)
        if reading is None:
            return
        prompt, completion, cached = reading
        try:
            self.recap.record_usage(
                cid,
                prompt_tokens=prompt,
                completion_tokens=completion,
                cached_tokens=cached,
                leaf=leaf,
            )
        except Exception as exc:  # the reply is out: a lost reading must not fail the run
            _host.log.warning("record_usage failed for %s: %s", cid, exc)

    async def pop_item(self, *, wrapper: Any = None) -> TResponseInputItem | None:
        """Take the most recent item off the conversation and return it as it was stored. It
        stays stored: the conversation's head moves back before it, for every session."""
        popped = await self._recap.run(self._pop)
        return popped  # type: ignore[return-value]  # the SDK's TypedDicts, as stored

    def _pop(self) -> dict[str, Any] | None:
        cid = self._current()
        with _conversation_lock(cid):
            return self._pop_locked(cid)

    def _pop_locked(self, cid: str) -> dict[str, Any] | None:
        stored = self.recap.export(cid, leaf=self.branch_end(cid)).messages
        if not stored:
            return None
        items = self.items_of([_without_id(stored[-1])])
        rest, last = items[:-1], (items[-1] if items else None)
        end = int(stored[-2]["id"]) if len(stored) > 1 else None
        if rest:  # the other items of the response, stored again as a message of their own
            end = self.recap.add_many(cid, self._stored_form(rest), parent_id=end)[-1]
        if end is None:  # the only message: the session starts over in a conversation of its own
            self._next_generation()
        else:
            self.recap.set_meta(cid, LEAF_KEY, end)
        return last

    def branch_end(self, cid: str) -> int | None:
        """Where the conversation's branch ends after a ``pop_item`` (None: at its head)."""
        leaf = self.recap.meta(cid).get(LEAF_KEY)
        return leaf if isinstance(leaf, int) else None

    async def clear_session(self, *, wrapper: Any = None) -> None:
        """Start the session over: a new, empty conversation holds it from now on, for every
        session object (the old one keeps every message and summary)."""
        await self._recap.run(self._clear)

    def _clear(self) -> None:
        cid = self._current()
        with _conversation_lock(cid):
            if self.recap.export(cid).messages:
                self._next_generation()

    def _next_generation(self) -> None:
        self._current()
        self._generation += 1
        self._ensure(self._generation_id(self._generation))


# --- stored form ---------------------------------------------------------------------------------


def _entries(wrapper: Any) -> list[Any]:
    """The run's usage readings, one per model call (``Usage.request_usage_entries``)."""
    entries = getattr(getattr(wrapper, "usage", None), "request_usage_entries", None)
    return entries if isinstance(entries, list) else []


def _cut_on_ingest(message: Mapping[str, Any], settings: Settings) -> bool:
    """Whether Recap's ingest will store a preview of the message, not the message (its
    limits: ``RECAP_MAX_OUTPUT_BYTES``/``LINES``, ``RECAP_MAX_ARGUMENT_CHARS``,
    ``RECAP_MEDIA_INLINE_BYTES``)."""
    content = message.get("content")
    if message.get("role") == "tool" and isinstance(content, str):
        lines = content.count("\n") + 1
        too_long = len(content.encode()) > settings.max_output_bytes
        return too_long or lines > settings.max_output_lines
    calls = message.get("tool_calls") or ()
    arguments = [str((c.get("function") or {}).get("arguments") or "") for c in calls]
    if any(len(a) > settings.max_argument_chars for a in arguments):
        return True
    return isinstance(content, list) and len(json.dumps(content)) > settings.media_inline_bytes


def _repaired(message: Mapping[str, Any]) -> bool:
    """Whether the assembly put in this result for a call that has none stored (what a model
    must be sent; the session gives the branch as stored)."""
    return (
        message.get("role") == "tool"
        and ORIGINAL_KEY not in message
        and message.get("content") == NO_RESULT_TEXT
    )


def _without_id(message: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in message.items() if k != "id"}


def usage_numbers(usage: Any) -> tuple[int, int, int] | None:
    """(input, output, cached) tokens of an SDK ``Usage``/``RequestUsage`` or a Responses
    usage object; None when the provider reported none."""
    prompt = getattr(usage, "input_tokens", None)
    if not isinstance(prompt, int) or prompt <= 0:
        return None
    completion = getattr(usage, "output_tokens", 0)
    details = getattr(usage, "input_tokens_details", None)
    cached = getattr(details, "cached_tokens", 0) if details is not None else 0
    return prompt, int(completion or 0), int(cached or 0)


def sub_agent_tool(
    agent: Any, *, parent: RecapSession, session: RecapSession, **as_tool: Any
) -> Any:
    """``agent.as_tool(...)`` run on its own ``RecapSession`` (``session``), whose conversation
    is attached to ``parent``'s after each run of the tool (``RecapSession.attach_sub_agent``).
    The keyword arguments are ``Agent.as_tool``'s (``tool_name``, ``tool_description``, ...)."""
    parent.attach_sub_agent(session)
    as_tool.setdefault("tool_name", None)
    as_tool.setdefault("tool_description", None)
    return agent.as_tool(session=session, **as_tool)
