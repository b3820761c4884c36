"""``RecapHistory``: Recap's store, assembly and background compression for Pydantic AI agents.

    from pydantic_ai import Agent
    from recap.integrations.pydantic_ai import RecapHistory

    history = RecapHistory("ticket-4711", max_input_tokens=32_000)
    agent = Agent(model, system_prompt="...", capabilities=[history])
    result = await agent.run("Where is my order?")  # no message_history: Recap holds it

As a capability: before each model request step the run's messages that Recap has not recorded
yet are added to the conversation (``before_model_request``; not a tool result whose call no
earlier response made, which Pydantic AI drops from the request too); each attempt at the
request is sent with Recap's assembly of the branch instead (the summary, the kept history,
cleared results as placeholders, valid tool call/return pairs), planned with the attempt's real
system prompt and instructions, tool definitions and ``max_tokens`` (``prepare_model_request``);
the usage of each response is recorded for the request it answered (``after_model_request``), so
the budget learns how the provider counts; a context-length error compresses now and makes one
more attempt with the new assembly (``on_model_request_error``, ``RetryModelRequest``), never
the same request again. The run's own history is left as the run made it. When the run ends its
final response is recorded and ``compress_session`` enqueued (``after_run``).

The same object is a plain history processor too (``capabilities=[ProcessHistory(history)]``;
Pydantic AI 1.x took it as ``history_processors=[history]``): it records, assembles (with the
system prompt, not the tools, which a processor does not see) and records each response's usage
when it next sees it, but never sees a run's final response: call ``await history.finish(result)``
after the run then.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import RetryModelRequest
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    SystemPromptPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.tools import RunContext

from recap.convert import pydantic_ai as convert
from recap.core.aio import AsyncRecap
from recap.core.client import Recap
from recap.integrations import _host, _loop

if TYPE_CHECKING:
    from pydantic_ai.models import ModelRequestContext, ModelRequestParameters
    from pydantic_ai.run import AgentRunResult

RUNS_KEPT = 256  # runs whose progress a processor remembers (a run ends with finish/after_run)


@dataclass
class _Run:
    """What RecapHistory keeps of one run in progress."""

    seen: int = 0  # leading messages of the run's history recorded (or from Recap's assembly)
    system: str | None = None  # the run's system prompt, taken off its first request
    assembled: _host.Assembled | None = None  # the request last sent, its usage not recorded yet
    parts: dict[str, Any] | None = None  # its fixed parts (system, tools, reserve)
    resend: _host.Assembled | None = None  # the request to send after a context overflow
    retried: bool = False  # this request step was compressed and tried again already


@dataclass(init=False)
class RecapHistory(AbstractCapability[Any]):
    """A history processor and capability keeping a Pydantic AI agent's history in Recap."""

    def __init__(
        self,
        conversation_id: str | None = None,
        *,
        recap: Recap | AsyncRecap | None = None,
        model: str | None = None,
        max_input_tokens: int | None = None,
        enqueue: bool = True,
        user_id: str | None = None,
    ) -> None:
        """``conversation_id`` fixes the conversation (default: each run's
        ``conversation_id``, so pass one to ``agent.run``); a new one is created with
        ``model``'s tokenizer and window, or ``max_input_tokens``. ``enqueue=False`` leaves
        compression to the host. ``user_id`` names the user whose memory the requests carry
        (docs/memory.md)."""
        if isinstance(recap, AsyncRecap):
            self._async = recap
        else:
            self._async = AsyncRecap(recap)
        self.recap = self._async.recap
        self.conversation_id = conversation_id
        self.model = model
        self.max_input_tokens = max_input_tokens
        self.enqueue = enqueue
        self._runs: OrderedDict[str, _Run] = OrderedDict()
        self._loop = _loop.HostLoop(
            self.recap, model=model, max_input_tokens=max_input_tokens, user_id=user_id
        )

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds a database handle: not spec-serializable

    def _name(self, ctx: RunContext[Any]) -> str:
        cid = self.conversation_id or ctx.conversation_id
        if not cid:
            raise ValueError("RecapHistory needs a conversation: RecapHistory(conversation_id)")
        return cid

    def _run(self, ctx: RunContext[Any]) -> _Run:
        key = ctx.run_id or ""
        run = self._runs.get(key)
        if run is None:
            run = self._runs[key] = _Run()
            while len(self._runs) > RUNS_KEPT:
                self._runs.popitem(last=False)
        return run

    def _take(self, run: _Run, messages: Sequence[ModelMessage]) -> list[dict[str, Any]]:
        """The run's messages not recorded yet, as Recap messages (its system prompt kept
        aside, for the requests)."""
        fresh = convert.to_recap(messages[run.seen :])
        system = [m["content"] for m in fresh if m["role"] == "system"]
        if system:
            run.system = "\n\n".join(str(text) for text in system)
        return [m for m in fresh if m["role"] != "system"]

    # --- the history processor --------------------------------------------------------------

    async def __call__(
        self, ctx: RunContext[Any], messages: list[ModelMessage]
    ) -> list[ModelMessage]:
        """Record the run's new messages (and the usage of a response among them), then give
        Recap's assembly of the conversation."""
        cid = self._name(ctx)
        run = self._run(ctx)
        reading = _reading_of(messages[run.seen :]) if run.assembled is not None else None
        sendable = _sendable(messages)
        records = self._take(run, sendable)
        parts: dict[str, Any] = {"system": run.system, "tools": None, "reserve": None}
        assembled = await self._async.run(self._assemble, cid, records, reading, parts)
        if not assembled.history:
            return messages
        out = self._request(run, assembled, sendable)
        run.seen, run.assembled = len(out), assembled
        return out

    def _assemble(
        self,
        cid: str,
        records: Sequence[dict[str, Any]],
        reading: _loop.Reading | None,
        parts: dict[str, Any],
    ) -> _host.Assembled:
        self._loop.ensure(cid)
        if reading is not None:  # the previous response, answering the request last assembled
            self._loop.record(cid, reading)
        _host.add_messages(self.recap, cid, records)
        return self._loop.assemble(cid, **parts)

    def _request(
        self, run: _Run, assembled: _host.Assembled, messages: Sequence[ModelMessage]
    ) -> list[ModelMessage]:
        """Recap's assembly as the messages of a request: the run's own messages where the
        assembly sends them as they are (their timestamps, run and conversation ids, usage and
        provider details kept), converted messages before them (a summary, placeholders,
        earlier runs), the run's system prompt in front, the last request's instructions
        kept."""
        history = [_normal(m) for m in assembled.history]
        kept = _kept_tail(history, messages)
        cut = len(history) - sum(len(_forms(m)) for m in kept)
        if cut == 0:
            return list(kept)
        out = convert.from_recap(assembled.history[:cut]) + [_no_system(m) for m in kept]
        if run.system is not None:
            if isinstance(out[0], ModelRequest):
                out[0] = replace(out[0], parts=[SystemPromptPart(run.system), *out[0].parts])
            else:
                out.insert(0, ModelRequest(parts=[SystemPromptPart(run.system)]))
        last = messages[-1] if messages else None
        if isinstance(last, ModelRequest) and isinstance(out[-1], ModelRequest) and not kept:
            out[-1] = replace(out[-1], instructions=last.instructions)
        return out

    async def finish(self, result: AgentRunResult[Any], *, run_id: str | None = None) -> None:
        """The end of a run: record what Recap has not seen (the final response, and its usage
        when a processor assembled the request it answers), then enqueue compression. A
        capability does this itself."""
        key = run_id or result.run_id or ""
        run = self._runs.pop(key, None) or _Run()
        cid = self.conversation_id or result.conversation_id
        if not cid:
            raise ValueError("RecapHistory needs a conversation: RecapHistory(conversation_id)")
        rest = _sendable(result.all_messages())[run.seen :]
        reading = _reading_of(rest) if run.assembled is not None else None
        records = [m for m in convert.to_recap(rest) if m["role"] != "system"]
        await self._async.run(self._finish, cid, records, reading)

    def _finish(
        self, cid: str, records: Sequence[dict[str, Any]], reading: _loop.Reading | None
    ) -> None:
        self._loop.ensure(cid)
        self._loop.record(cid, reading)
        _host.add_messages(self.recap, cid, records)
        if self.enqueue:
            self._loop.enqueue(cid)

    # --- the capability ---------------------------------------------------------------------

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        """Once per request step: record the run's messages Recap has not seen."""
        cid = self._name(ctx)
        run = self._run(ctx)
        records = self._take(run, _sendable(request_context.messages))
        run.seen, run.retried, run.resend = len(request_context.messages), False, None
        await self._async.run(self._record, cid, records)
        return request_context

    def _record(self, cid: str, records: Sequence[dict[str, Any]]) -> None:
        self._loop.ensure(cid)
        _host.add_messages(self.recap, cid, records)

    async def prepare_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        """Each attempt: Recap's assembly, planned with the attempt's own fixed parts."""
        cid = self._name(ctx)
        run = self._run(ctx)
        parts: dict[str, Any] = {
            "system": _system_text(run.system, request_context.model_request_parameters),
            "tools": _tool_schemas(request_context.model_request_parameters),
            "reserve": _max_tokens(request_context.model_settings),
        }
        assembled = run.resend  # the request assembled after a context overflow, if any
        run.resend = None
        if assembled is None:
            assembled = await self._async.run(self._loop.assemble, cid, **parts)
        run.assembled, run.parts = assembled, parts
        if assembled.history:
            request_context.messages = self._request(
                run, assembled, _sendable(request_context.messages)
            )
        return request_context

    async def after_model_request(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        response: ModelResponse,
    ) -> ModelResponse:
        """Record the response's usage for the request it answered."""
        run = self._run(ctx)
        reading = _reading_of([response])
        if run.assembled is not None and reading is not None:
            run.assembled = None
            await self._async.run(self._loop.record, self._name(ctx), reading)
        return response

    async def on_model_request_error(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        error: Exception,
    ) -> ModelResponse:
        """A context-length error: compress now and attempt once more with the new assembly
        (never the same request); any other error, or a second overflow, goes on."""
        run = self._run(ctx)
        failed, parts = run.assembled, run.parts
        if run.retried or failed is None or parts is None or not _loop.is_context_overflow(error):
            raise error
        run.retried = True
        cid = self._name(ctx)
        again = await self._async.run(self._loop.after_overflow, cid, error, failed, **parts)
        if again is None:
            raise error
        run.resend = again
        raise RetryModelRequest()

    async def after_run(
        self, ctx: RunContext[Any], *, result: AgentRunResult[Any]
    ) -> AgentRunResult[Any]:
        await self.finish(result, run_id=ctx.run_id)
        return result


def _sendable(messages: Sequence[ModelMessage]) -> list[ModelMessage]:
    """The run's messages without the tool results whose call no earlier response made, as
    Pydantic AI drops them before each request (a history processor that drops the response
    holding a call leaves its result behind, say): Recap's store takes no result without its
    call. A request left with no parts stays, so the run's message positions hold."""
    calls: set[str] = set()
    out: list[ModelMessage] = []
    for message in messages:
        if isinstance(message, ModelResponse):
            calls.update(p.tool_call_id for p in message.parts if isinstance(p, ToolCallPart))
            out.append(message)
            continue
        parts = [p for p in message.parts if (call := _answered_call(p)) is None or call in calls]
        out.append(message if len(parts) == len(message.parts) else replace(message, parts=parts))
    return out


def _answered_call(part: object) -> str | None:
    """The id of the call a part answers, when it is stored as a tool message
    (``convert.request_to_recap``)."""
    if isinstance(part, ToolReturnPart) or (
        isinstance(part, RetryPromptPart) and part.tool_name is not None
    ):
        return part.tool_call_id
    return None


def _normal(message: dict[str, Any]) -> dict[str, Any]:
    """A Recap message as its Pydantic AI form gives it back (what a comparison can rely on)."""
    return convert.to_recap(convert.from_recap([message]))[0]


def _forms(message: ModelMessage) -> list[dict[str, Any]]:
    """A run's message as the Recap messages it is stored as (its system prompt aside)."""
    return [_normal(m) for m in convert.to_recap([message]) if m["role"] != "system"]


def _kept_tail(
    history: list[dict[str, Any]], messages: Sequence[ModelMessage]
) -> list[ModelMessage]:
    """The longest tail of the run's messages that the assembly ends with unchanged."""
    end = len(history)
    kept: list[ModelMessage] = []
    for message in reversed(messages):
        forms = _forms(message)
        if len(forms) > end or history[end - len(forms) : end] != forms:
            break
        end -= len(forms)
        kept.append(message)
    kept.reverse()
    return kept


def _no_system(message: ModelMessage) -> ModelMessage:
    """A run's message without its system prompt parts (the request's own goes in front)."""
    if isinstance(message, ModelRequest) and any(
        isinstance(p, SystemPromptPart) for p in message.parts
    ):
        return replace(
            message, parts=[p for p in message.parts if not isinstance(p, SystemPromptPart)]
        )
    return message


def _reading_of(messages: Iterable[ModelMessage]) -> _loop.Reading | None:
    """The usage of the first model response among ``messages`` (None when it reports none)."""
    for message in messages:
        if isinstance(message, ModelResponse):
            usage = message.usage
            if not usage.input_tokens:
                return None
            return _loop.Reading(usage.input_tokens, usage.output_tokens, usage.cache_read_tokens)
    return None


def _system_text(system: str | None, parameters: ModelRequestParameters) -> str | None:
    """The system prompt and the instructions the request is sent with, as one text."""
    texts = [system] if system else []
    texts.extend(part.content for part in parameters.instruction_parts or () if part.content)
    return "\n\n".join(texts) if texts else None


def _tool_schemas(parameters: ModelRequestParameters) -> list[dict[str, Any]] | None:
    """The tool definitions the request declares (function and output tools), as OpenAI tool
    schemas for the budget; a provider's native tools are counted by name."""
    declared = getattr(parameters, "declared_tool_defs", None) or parameters.tool_defs
    schemas = [
        _loop.openai_tool(tool.name, tool.description, tool.parameters_json_schema)
        for tool in declared.values()
    ]
    for native in parameters.native_tools:
        schemas.append(_loop.openai_tool(str(getattr(native, "kind", native)), None, {}))
    return schemas or None


def _max_tokens(settings: Any) -> int | None:
    value = settings.get("max_tokens") if isinstance(settings, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
