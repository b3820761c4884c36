"""``RecapMiddleware``: a LangChain v1 agent middleware whose model calls see Recap's assembly.

    from langchain.agents import create_agent
    from recap.integrations.langchain import RecapMiddleware

    agent = create_agent(model, tools, middleware=[RecapMiddleware(max_input_tokens=32_000)])
    agent.invoke({"messages": [("user", "hi")]}, {"configurable": {"thread_id": "ticket-4711"}})

The conversation is the run's ``thread_id`` (or ``conversation_id``). Before each model call the
state's messages not recorded yet are added to Recap (tool messages with their call ids); the
model call then gets Recap's assembly of the thread in place of the message list (the summary,
the kept history, cleared results as placeholders, valid tool pairs), while the graph state is
left as it is. The assembly is planned with the request's own system prompt, tool schemas and
``max_tokens``; the usage the model reports (``AIMessage.usage_metadata``) is recorded for the
request it answered, so the budget learns how the provider counts; a context-length error
compresses now and sends the new assembly once (never the same request again). After the agent's
turn its last messages are recorded and ``compress_session`` is enqueued. With a checkpointer the
state remembers how many of its messages are recorded; without one, each run's input messages are
the new ones (Recap holds the history), so pass only those.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NotRequired

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, BaseMessage
from langgraph.config import get_config
from langgraph.runtime import Runtime

from recap.convert import langchain as convert
from recap.core.aio import AsyncRecap
from recap.core.client import Recap
from recap.core.errors import InputError, NotFoundError
from recap.integrations import _host, _loop, _subagents

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
        user_id: str | None = None,
    ) -> None:
        """``conversation_id`` fixes the conversation (default: each run's ``thread_id``); a new
        one is created with ``model``'s tokenizer and window, or ``max_input_tokens``.
        ``enqueue=False`` leaves compression to the host. ``user_id`` names the user whose
        memory the requests carry and whose turns it is extracted from (docs/memory.md)."""
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
        self._loop = _loop.HostLoop(
            self.recap, model=model, max_input_tokens=max_input_tokens, user_id=user_id
        )

    # --- which conversation -----------------------------------------------------------------

    def _name(self) -> str:
        """The conversation of this run (read from the run's config: call it on the graph's
        thread, where the config is set). A run inside another ``RecapMiddleware`` agent's tool
        call on the same thread is its sub-agent: a conversation of its own, attached to the
        parent's after the tool's result (``_subagents``)."""
        try:
            configurable = get_config().get("configurable") or {}
        except RuntimeError:
            configurable = {}
        placed = _subagents.place(configurable, self.conversation_id)
        if placed is None:
            raise ValueError(
                "RecapMiddleware needs a conversation: pass conversation_id=..., or run the "
                "agent with config={'configurable': {'thread_id': ...}}"
            )
        return placed.conversation_id

    def _attach_subs(self, cid: str) -> None:
        """Attach the sub-agents run from this conversation's tool calls, after the head (the
        record before the next model call, when the tools' results are in). One that cannot
        be attached (empty, erased, attached already) is dropped: a record never fails for it."""
        for sub in _subagents.waiting(cid):
            with contextlib.suppress(InputError, NotFoundError):
                self.recap.attach(cid, source=sub)
            _subagents.attached(cid, sub)

    # --- recording --------------------------------------------------------------------------

    def _record(self, state: Mapping[str, Any], cid: str) -> dict[str, Any] | None:
        """Add the state's messages Recap has not recorded yet; the state update."""
        self._loop.ensure(cid)
        messages: Sequence[BaseMessage] = state.get("messages") or ()
        done = int(state.get(RECORDED_KEY) or 0)
        if done > len(messages):  # the state was cut back (a rewind): nothing new to record
            done = len(messages)
        fresh = [m for m in messages[done:] if convert.ROLE_OF.get(m.type)]
        _host.add_messages(self.recap, cid, convert.to_recap_all(fresh))
        self._attach_subs(cid)
        if done == len(messages) and RECORDED_KEY in state:
            return None
        return {RECORDED_KEY: len(messages)}

    def _after(self, state: Mapping[str, Any], cid: str) -> dict[str, Any] | None:
        update = self._record(state, cid)
        if self.enqueue:
            _host.enqueue(self.recap, cid, user_id=self._loop.user_id)
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

    def _request(self, request: ModelRequest[Any], cid: str) -> _Call:
        """The request with Recap's assembly in place of its messages."""
        call = _Call(cid, request)
        call.assembled = self._loop.assemble(cid, **call.parts)
        return call

    def _after_overflow(self, call: _Call, error: BaseException) -> bool:
        """Compress after the provider's context-length error and assemble again; whether
        there is a new request to send."""
        if call.retried or call.assembled is None or not _loop.is_context_overflow(error):
            return False
        call.retried = True
        again = self._loop.after_overflow(call.cid, error, call.assembled, **call.parts)
        if again is None:
            self._failed(call)
            return False
        call.assembled = again
        return True

    def _retry(
        self, call: _Call, handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]
    ) -> ModelResponse[Any]:
        try:
            return handler(call.sent())
        except Exception:
            self._failed(call)
            raise

    def _failed(self, call: _Call) -> None:
        """The call failed for good: the run ends before ``after_agent``, so enqueue the turn's
        compression here (the next turn then finds the conversation compressed)."""
        if self.enqueue:
            self._loop.enqueue(call.cid)

    def _record_usage(self, call: _Call, response: Any) -> None:
        self._loop.record(call.cid, _reading(response))

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        call = self._request(request, self._name())
        try:
            response = handler(call.sent())
        except Exception as exc:
            if not self._after_overflow(call, exc):
                raise
            response = self._retry(call, handler)
        self._record_usage(call, response)
        return response

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        run = self._async.run
        call = await run(self._request, request, self._name())
        try:
            response = await handler(call.sent())
        except Exception as exc:
            if not await run(self._after_overflow, call, exc):
                raise
            try:
                response = await handler(call.sent())
            except Exception:
                await run(self._failed, call)
                raise
        await run(self._record_usage, call, response)
        return response


class _Call:
    """One model call of the agent: the framework's request, its fixed parts as Recap counts
    them, and Recap's assembly for it."""

    def __init__(self, cid: str, request: ModelRequest[Any]) -> None:
        self.cid = cid
        self.request = request
        self.parts: dict[str, Any] = {
            "system": convert.message_text(request.system_message),
            "tools": _tool_schemas(request.tools),
            "reserve": _max_tokens(request),
        }
        self.assembled: _host.Assembled | None = None
        self.retried = False

    def sent(self) -> ModelRequest[Any]:
        """The request to hand on: the framework's, with Recap's messages when it has any."""
        if self.assembled is None or not self.assembled.history:
            return self.request  # nothing recorded yet: the request as it came
        return self.request.override(messages=convert.from_recap_all(self.assembled.history))


def _max_tokens(request: ModelRequest[Any]) -> int | None:
    """The reply's ``max_tokens`` of this call: the call's settings, else the chat model's."""
    for value in (
        request.model_settings.get("max_tokens"),
        request.model_settings.get("max_completion_tokens"),
        getattr(request.model, "max_tokens", None),
        getattr(request.model, "max_completion_tokens", None),
    ):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _reading(response: Any) -> _loop.Reading | None:
    """The usage the model reported on its answer (``AIMessage.usage_metadata``)."""
    response = getattr(response, "model_response", response)  # an ExtendedModelResponse
    messages = [response] if isinstance(response, AIMessage) else getattr(response, "result", [])
    for message in reversed(messages):
        usage = getattr(message, "usage_metadata", None) if isinstance(message, AIMessage) else None
        if usage:
            details = usage.get("input_token_details") or {}
            return _loop.Reading(
                int(usage.get("input_tokens") or 0),
                int(usage.get("output_tokens") or 0),
                int(details.get("cache_read") or 0),
            )
    return None


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
