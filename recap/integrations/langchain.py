"""``RecapMiddleware``: a LangChain v1 agent middleware whose model calls see Recap's assembly.

    from langchain.agents import create_agent
    from recap.integrations.langchain import RecapMiddleware

    agent = create_agent(model, tools, middleware=[RecapMiddleware(max_input_tokens=32_000)])
    agent.invoke({"messages": [("user", "hi")]}, {"configurable": {"thread_id": "ticket-4711"}})

The conversation is the run's ``thread_id`` (or ``conversation_id``). Before each model call the
state's messages not recorded yet are added to Recap (tool messages with their call ids); the
model call then gets Recap's assembly of the thread in place of the message list (the summary,
the kept history, cleared results as placeholders, valid tool pairs), while the graph state is
left as it is. After the agent's turn its last messages are recorded and ``compress_session`` is
enqueued. With a checkpointer the state remembers how many of its messages are recorded; without
one, each run's input messages are the new ones (Recap holds the history), so pass only those.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NotRequired

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain_core.messages import BaseMessage
from langgraph.config import get_config
from langgraph.runtime import Runtime

from recap.core.aio import AsyncRecap
from recap.core.client import Recap
from recap.convert import langchain as convert
from recap.integrations import _host

RECORDED_KEY = "recap_recorded"


class RecapState(AgentState[Any]):
    """The agent state, with how many of its messages Recap has recorded."""

    recap_recorded: NotRequired[int]


class RecapMiddleware(AgentMiddleware[RecapState, Any, Any]):
    """Recap's store, assembly and background compression for a ``create_agent`` agent."""

    state_schema = RecapState

    def __init__(
        self,
        *,
        recap: Recap | AsyncRecap | None = None,
        conversation_id: str | None = None,
        max_input_tokens: int | None = None,
        model: str | None = None,
        enqueue: bool = True,
    ) -> None:
        """``conversation_id`` fixes the conversation (default: each run's ``thread_id``); a new
        one is created with ``model``'s tokenizer and window, or ``max_input_tokens``.
        ``enqueue=False`` leaves compression to the host."""
        super().__init__()
        if isinstance(recap, AsyncRecap):
            self._async = recap
        else:
            self._async = AsyncRecap(recap)
        self.recap = self._async.recap
        self.conversation_id = conversation_id
        self.max_input_tokens = max_input_tokens
        self.model = model
        self.enqueue = enqueue
        self._known: set[str] = set()  # conversations seen to exist by this middleware

    # --- which conversation -----------------------------------------------------------------

    def _name(self) -> str:
        """The conversation of this run (read from the run's config: call it on the graph's
        thread, where the config is set)."""
        cid = self.conversation_id
        if cid is None:
            try:
                configurable = get_config().get("configurable") or {}
            except RuntimeError:
                configurable = {}
            thread = configurable.get("thread_id")
            cid = str(thread) if thread is not None else None
        if not cid:
            raise ValueError(
                "RecapMiddleware needs a conversation: pass conversation_id=..., or run the "
                "agent with config={'configurable': {'thread_id': ...}}"
            )
        return cid

    def _ensure(self, cid: str) -> str:
        if cid not in self._known:
            _host.ensure_conversation(
                self.recap, cid, model=self.model, max_input_tokens=self.max_input_tokens
            )
            self._known.add(cid)
        return cid

    # --- recording --------------------------------------------------------------------------

    def _record(self, state: Mapping[str, Any], cid: str) -> dict[str, Any] | None:
        """Add the state's messages Recap has not recorded yet; the state update."""
        self._ensure(cid)
        messages: Sequence[BaseMessage] = state.get("messages") or ()
        done = int(state.get(RECORDED_KEY) or 0)
        if done > len(messages):  # the state was cut back (a rewind): nothing new to record
            done = len(messages)
        fresh = [m for m in messages[done:] if convert.ROLE_OF.get(m.type)]
        _host.add_messages(self.recap, cid, convert.to_recap_all(fresh))
        if done == len(messages) and RECORDED_KEY in state:
            return None
        return {RECORDED_KEY: len(messages)}

    def _after(self, state: Mapping[str, Any], cid: str) -> dict[str, Any] | None:
        update = self._record(state, cid)
        if self.enqueue:
            _host.enqueue(self.recap, cid)
        return update

    def before_model(self, state: RecapState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self._record(state, self._name())

    async def abefore_model(
        self, state: RecapState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        return await self._async.run(self._record, state, self._name())

    def after_agent(self, state: RecapState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self._after(state, self._name())

    async def aafter_agent(self, state: RecapState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return await self._async.run(self._after, state, self._name())

    # --- the model call ---------------------------------------------------------------------

    def _request(self, request: ModelRequest[Any], cid: str) -> ModelRequest[Any]:
        """The request with Recap's assembly in place of its messages."""
        self._ensure(cid)
        assembled = _host.assemble(
            self.recap,
            cid,
            system=convert.message_text(request.system_message),
            tools=_tool_schemas(request.tools),
        )
        if not assembled.history:  # nothing recorded yet: the request as it came
            return request
        return request.override(messages=convert.from_recap_all(assembled.history))

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        return handler(self._request(request, self._name()))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        return await handler(await self._async.run(self._request, request, self._name()))


def _tool_schemas(tools: Sequence[Any]) -> list[dict[str, Any]] | None:
    """The request's tools as OpenAI schemas, for the budget (a tool that cannot be converted,
    a provider's built-in one, is counted as given)."""
    if not tools:
        return None
    from langchain_core.utils.function_calling import convert_to_openai_tool

    schemas: list[dict[str, Any]] = []
    for tool in tools:
        try:
            schemas.append(convert_to_openai_tool(tool))
        except Exception:  # a provider tool given as a dict of its own
            schemas.append(dict(tool) if isinstance(tool, Mapping) else {"name": str(tool)})
    return schemas
