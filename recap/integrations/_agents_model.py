"""``RecapModel``: an Agents SDK ``Model`` around the agent's own, for a ``RecapSession``.

Before each model call the session's conversation is assembled at its head with what the call
really sends beside the history: the agent's instructions, its function tools and handoffs as
tool schemas, and ``model_settings.max_tokens`` as the output reserve. When the call's input ends
with the conversation's head (the SDK stores each item before the next call), the input is that
assembly, so the request sent is the one Recap measured. After the call the provider's usage
(input, output and cached tokens) is recorded against it. A context-length error is answered by
compressing the conversation now and sending the new assembly once more (a stream only when it
failed before its first event).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agents.models.interface import Model

from recap.integrations._agents_items import FixedParts, media_aged, sent_whole, with_originals

if TYPE_CHECKING:
    from agents.agent_output import AgentOutputSchemaBase
    from agents.handoffs import Handoff
    from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
    from agents.model_settings import ModelSettings
    from agents.models.interface import ModelTracing
    from agents.tool import Tool

    from recap.integrations.openai_agents import RecapSession

OVERFLOW_CODE = "context_length_exceeded"  # OpenAI's error code for a request over the window
OVERFLOW_WORDS = ("context length", "context window", "maximum context", "too many tokens")
COMPLETED_EVENT = "response.completed"  # the stream event that carries the response's usage


@dataclass(frozen=True)
class Call:
    """One model call's input, and where Recap assembled it (None: not Recap's request)."""

    input: str | list[TResponseInputItem]
    conversation_id: str | None = None
    leaf: int | None = None


class RecapModel(Model):
    """The agent's model, each call assembled and measured by a ``RecapSession``."""

    def __init__(self, inner: Model | str, session: RecapSession) -> None:
        if isinstance(inner, str):
            from agents.models.openai_provider import OpenAIProvider

            inner = OpenAIProvider().get_model(inner)
        self.inner = inner
        self.session = session
        session._model_records = True  # every call's usage is recorded here, not by add_items

    async def close(self) -> None:
        await self.inner.close()

    def get_retry_advice(self, request: Any) -> Any:
        return self.inner.get_retry_advice(request)

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        parts = (system_instructions, input, model_settings, tools, handoffs)
        call = await self._prepare(*parts, compress=False)
        rest = (model_settings, tools, output_schema, handoffs, tracing)
        options = {
            "previous_response_id": previous_response_id,
            "conversation_id": conversation_id,
            "prompt": prompt,
        }
        try:
            response = await self.inner.get_response(
                system_instructions, call.input, *rest, **options
            )
        except Exception as exc:
            call = await self._compressed(call, parts, exc)
            response = await self.inner.get_response(
                system_instructions, call.input, *rest, **options
            )
        await self._record(call, response.usage)
        return response

    async def stream_response(  # an async generator, as the SDK's own models
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> AsyncIterator[TResponseStreamEvent]:
        parts = (system_instructions, input, model_settings, tools, handoffs)
        call = await self._prepare(*parts, compress=False)
        rest = (model_settings, tools, output_schema, handoffs, tracing)
        options = {
            "previous_response_id": previous_response_id,
            "conversation_id": conversation_id,
            "prompt": prompt,
        }
        usage: Any = None
        started = False
        try:
            async for event in self.inner.stream_response(
                system_instructions, call.input, *rest, **options
            ):
                started = True
                usage = _completed_usage(event) or usage
                yield event
        except Exception as exc:
            if started:
                raise
            call = await self._compressed(call, parts, exc)
            async for event in self.inner.stream_response(
                system_instructions, call.input, *rest, **options
            ):
                usage = _completed_usage(event) or usage
                yield event
        await self._record(call, usage)

    async def _compressed(self, call: Call, parts: tuple[Any, ...], error: Exception) -> Call:
        """The call once more after compressing, for a context-length error; the error itself
        when it is another, or when compressing left the request as it was (sending it again
        would only fail again)."""
        if call.leaf is None or not context_overflow(error):
            raise error
        again = await self._prepare(*parts, compress=True)
        if again.input == call.input:
            raise error
        return again

    async def _prepare(
        self,
        system: str | None,
        input: str | list[TResponseInputItem],
        settings: ModelSettings,
        tools: list[Tool],
        handoffs: list[Handoff],
        *,
        compress: bool,
    ) -> Call:
        fixed = FixedParts(system, tuple(tool_schemas(tools, handoffs)))
        reserve = getattr(settings, "max_tokens", None)
        return await self.session._recap.run(self._assemble, fixed, reserve, input, compress)

    def _assemble(self, fixed: FixedParts, reserve: int | None, input: Any, compress: bool) -> Call:
        session = self.session
        session.fixed = fixed
        cid = session._current()
        if reserve != session._reserve:
            session.recap.set_output_reserve(cid, reserve)
            session._reserve = reserve
        if not isinstance(input, list) or not input or session.session_settings.limit is not None:
            return Call(input)  # not a history Recap holds whole: sent as the SDK built it
        stored = session.recap.export(cid, leaf=session.branch_end(cid)).messages
        if not stored:
            return Call(input)
        leaf = int(stored[-1]["id"])
        fresh = session.items_of(session._assemble(cid, leaf, compress=compress).history)
        if not fresh or not _same_item(fresh[-1], input[-1]):
            return Call(input)  # the input ends with something not stored: the SDK's own
        return Call(fresh, cid, leaf)  # type: ignore[arg-type]  # the SDK's TypedDicts

    async def _record(self, call: Call, usage: Any) -> None:
        if call.conversation_id is None or call.leaf is None or usage is None:
            return
        await self.session._recap.run(self.session.record, call.conversation_id, call.leaf, usage)


def tool_schemas(tools: list[Any], handoffs: list[Any]) -> list[dict[str, Any]]:
    """The function tools and handoffs as OpenAI tool schemas, as the model is sent them
    (hosted tools have no schema of the caller's and are left out)."""
    schemas = []
    for tool in tools:
        parameters = getattr(tool, "params_json_schema", None)
        if isinstance(parameters, Mapping):
            schemas.append(_function(tool.name, getattr(tool, "description", ""), parameters))
    for handoff in handoffs:
        schemas.append(
            _function(handoff.tool_name, handoff.tool_description, handoff.input_json_schema)
        )
    return schemas


def _function(name: str, description: str | None, parameters: Any) -> dict[str, Any]:
    function = {"name": name, "description": description or "", "parameters": parameters}
    return {"type": "function", "function": function}


def context_overflow(exc: BaseException) -> bool:
    """Whether the provider refused the request for not fitting its window."""
    body = getattr(exc, "body", None)
    codes = {getattr(exc, "code", None)}
    if isinstance(body, Mapping):
        error = body.get("error")
        codes.add((error if isinstance(error, Mapping) else body).get("code"))
    if OVERFLOW_CODE in codes:
        return True
    text = str(exc).lower()
    return OVERFLOW_CODE in text or any(words in text for words in OVERFLOW_WORDS)


def _completed_usage(event: Any) -> Any:
    if getattr(event, "type", None) != COMPLETED_EVENT:
        return None
    return getattr(getattr(event, "response", None), "usage", None)


def _same_item(left: Any, right: Any) -> bool:
    """Whether two items stand for the same stored message (what a call's input ends with):
    the same call's output or call (Recap may send a tool result shortened to fit, its call id
    unchanged), else a message sent whole or with its media as placeholders."""
    if not isinstance(left, Mapping) or not isinstance(right, Mapping):
        return False
    call = right.get("call_id")
    if call is not None and left.get("call_id") == call and left.get("type") == right.get("type"):
        return True
    try:
        message = with_originals([dict(right)])
    except (AttributeError, TypeError, KeyError):
        return False
    if len(message) != 1:
        return False
    return sent_whole(message[0], [dict(left)]) or media_aged(message[0], [dict(left)])
