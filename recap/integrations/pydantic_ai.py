"""``RecapHistory``: Recap's store, assembly and background compression for Pydantic AI agents.

    from pydantic_ai import Agent
    from recap.integrations.pydantic_ai import RecapHistory

    history = RecapHistory("ticket-4711", max_input_tokens=32_000)
    agent = Agent(model, system_prompt="...", capabilities=[history])
    result = await agent.run("Where is my order?")  # no message_history: Recap holds it

Before each model request the messages of the run that Recap has not recorded yet are added to
the conversation, and the request is sent with Recap's assembly of the branch instead (the
summary, the kept history, cleared results as placeholders, valid tool call/return pairs); the
run's history becomes that assembly, as with any history processor. As a capability it also
records the run's final response when the run ends and enqueues ``compress_session``. The same
object is a plain history processor too (``capabilities=[ProcessHistory(history)]``; Pydantic AI
1.x took it as ``history_processors=[history]``), which records and assembles but never sees a
run's final response: call ``await history.finish(result)`` after the run then.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelRequest, SystemPromptPart
from pydantic_ai.tools import RunContext

from recap.core.aio import AsyncRecap
from recap.core.client import Recap
from recap.convert import pydantic_ai as convert
from recap.integrations import _host

if TYPE_CHECKING:
    from pydantic_ai.models import ModelRequestContext
    from pydantic_ai.run import AgentRunResult

RUNS_KEPT = 256  # runs whose progress a processor remembers (a run ends with finish/after_run)


@dataclass
class _Run:
    seen: int  # leading messages of the run's history that came from Recap's assembly
    system: str | None  # the run's system prompt, taken off its first request


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
    ) -> None:
        """``conversation_id`` fixes the conversation (default: each run's
        ``conversation_id``, so pass one to ``agent.run``); a new one is created with
        ``model``'s tokenizer and window, or ``max_input_tokens``. ``enqueue=False`` leaves
        compression to the host."""
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
        self._known: set[str] = set()

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds a database handle: not spec-serializable

    def _name(self, ctx: RunContext[Any]) -> str:
        cid = self.conversation_id or ctx.conversation_id
        if not cid:
            raise ValueError("RecapHistory needs a conversation: RecapHistory(conversation_id)")
        return cid

    def _ensure(self, cid: str) -> None:
        if cid not in self._known:
            _host.ensure_conversation(
                self.recap, cid, model=self.model, max_input_tokens=self.max_input_tokens
            )
            self._known.add(cid)

    # --- the history processor --------------------------------------------------------------

    async def __call__(
        self, ctx: RunContext[Any], messages: list[ModelMessage]
    ) -> list[ModelMessage]:
        """Record the run's new messages, then give Recap's assembly of the conversation."""
        cid = self._name(ctx)
        key = ctx.run_id or ""
        run = self._runs.get(key)
        if run is None:
            run = self._runs[key] = _Run(0, None)
            while len(self._runs) > RUNS_KEPT:
                self._runs.popitem(last=False)
        fresh = convert.to_recap(messages[run.seen :])
        system = [m["content"] for m in fresh if m["role"] == "system"]
        if system:
            run.system = "\n\n".join(str(text) for text in system)
        records = [m for m in fresh if m["role"] != "system"]
        assembled = await self._async.run(self._assemble, cid, records, run.system)
        if not assembled:
            return messages
        out = convert.from_recap(assembled)
        if run.system is not None and isinstance(out[0], ModelRequest):
            out[0] = replace(out[0], parts=[SystemPromptPart(run.system), *out[0].parts])
        last = messages[-1] if messages else None
        if isinstance(last, ModelRequest) and isinstance(out[-1], ModelRequest):
            out[-1] = replace(out[-1], instructions=last.instructions)
        run.seen = len(out)
        return out

    def _assemble(
        self, cid: str, records: Sequence[dict[str, Any]], system: str | None
    ) -> list[dict[str, Any]]:
        self._ensure(cid)
        _host.add_messages(self.recap, cid, records)
        return _host.assemble(self.recap, cid, system=system).history

    async def finish(self, result: AgentRunResult[Any], *, run_id: str | None = None) -> None:
        """The end of a run: record what Recap has not seen (the final response), then enqueue
        compression. A capability does this itself."""
        key = run_id or result.run_id or ""
        run = self._runs.pop(key, None)
        seen = run.seen if run is not None else 0
        cid = self.conversation_id or result.conversation_id
        if not cid:
            raise ValueError("RecapHistory needs a conversation: RecapHistory(conversation_id)")
        records = [
            m for m in convert.to_recap(result.all_messages()[seen:]) if m["role"] != "system"
        ]
        await self._async.run(self._finish, cid, records)

    def _finish(self, cid: str, records: Sequence[dict[str, Any]]) -> None:
        self._ensure(cid)
        _host.add_messages(self.recap, cid, records)
        if self.enqueue:
            _host.enqueue(self.recap, cid)

    # --- the capability ---------------------------------------------------------------------

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        messages = await self(ctx, list(request_context.messages))
        request_context.messages = messages.copy()
        ctx.messages[:] = messages
        return request_context

    async def after_run(
        self, ctx: RunContext[Any], *, result: AgentRunResult[Any]
    ) -> AgentRunResult[Any]:
        await self.finish(result, run_id=ctx.run_id)
        return result
