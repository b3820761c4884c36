"""``AsyncRecap``: Recap for asyncio hosts (an ASGI app, an async agent loop).

Every ``Recap`` call reads or writes the database and counts tokens: blocking work that would
stall an event loop for as long as it takes. ``AsyncRecap`` runs each call in a bounded thread
pool of its own and awaits the result, so the loop keeps serving other requests meanwhile::

    recap = AsyncRecap()
    await recap.add(conversation_id, {"role": "user", "content": "hi"})
    request = await recap.assemble(conversation_id, system="You are ...")

The pool is bounded (``RECAP_SERVE_THREADS`` by default, a few more than the engine pool's
connections) so a burst of requests queues for a thread instead of opening connections without
limit. Cancelling an awaiting task does not stop its call: the thread finishes it, so a write
either lands whole or not at all, as with the blocking API. ``run`` runs any other blocking
function (a host's own database read, a compression run) on the same pool, in the caller's
context (its current OpenTelemetry span, its structlog context variables). Close the pool with
``close()``, or use the object as an async context manager.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from recap.core.client import Recap
from recap.core.recall import Recalled
from recap.core.request import assembly
from recap.core.results import (
    CompressResult,
    ExportedConversation,
    PinResult,
    Stats,
    SummaryInfo,
    UsageRecorded,
)
from recap.core.service.attaching import Attached, MergeStarted
from recap.core.settings import Settings
from recap.core.values.request import ContextFile, RequestSpec, request_from

P = ParamSpec("P")
T = TypeVar("T")
THREAD_PREFIX = "recap-io"


class AsyncRecap:
    """``Recap``'s calls as coroutines, each run on a bounded thread pool."""

    def __init__(
        self,
        recap: Recap | None = None,
        *,
        settings: Settings | None = None,
        max_workers: int | None = None,
    ) -> None:
        self.recap = recap or Recap(settings)
        threads = max_workers or self.recap.settings.serve_threads
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=THREAD_PREFIX)

    @property
    def settings(self) -> Settings:
        return self.recap.settings

    async def run(self, func: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``func(*args, **kwargs)`` on the pool; its result (or its exception) here."""
        loop = asyncio.get_running_loop()
        call = functools.partial(func, *args, **kwargs)
        # in the caller's context (as asyncio.to_thread): its current span, its log fields
        return await loop.run_in_executor(self._pool, contextvars.copy_context().run, call)

    async def new(
        self,
        conversation_id: str | None = None,
        *,
        model: str | None = None,
        max_input_tokens: int | None = None,
    ) -> str:
        """``Recap.new``: create an empty conversation; its id."""
        return await self.run(
            self.recap.new, conversation_id, model=model, max_input_tokens=max_input_tokens
        )

    async def add(
        self, conversation_id: str, message: Mapping[str, Any], *, parent_id: int | None = None
    ) -> int:
        """``Recap.add``: append one message (or branch from ``parent_id``); its id."""
        return await self.run(self.recap.add, conversation_id, message, parent_id=parent_id)

    async def add_many(
        self,
        conversation_id: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        parent_id: int | None = None,
    ) -> list[int]:
        """``Recap.add_many``: one turn's messages in one transaction; their ids."""
        return await self.run(self.recap.add_many, conversation_id, messages, parent_id=parent_id)

    async def compress(
        self, conversation_id: str, *, leaf: int | None = None, force: bool = False
    ) -> CompressResult:
        """``Recap.compress``: compress now so that the next request fits (seconds, with a
        summary model): call it on ``BudgetError`` or a provider's context overflow."""
        return await self.run(self.recap.compress, conversation_id, leaf=leaf, force=force)

    async def assemble(
        self,
        conversation_id: str,
        *,
        leaf: int | None = None,
        system: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        reminder: str | None = None,
        context_files: Iterable[ContextFile] = (),
        text_only: bool = False,
        cache_breakpoints: bool | None = None,
        model: str | None = None,
        max_input_tokens: int | None = None,
        as_of: datetime | None = None,
        request: RequestSpec | None = None,
        user_id: str | None = None,
    ) -> assembly.AssembledRequest:
        """``Recap.assemble``: the request to send now (its keyword parts, or ``request``)."""
        spec = request_from(
            request,
            system=system,
            tools=tools,
            reminder=reminder,
            context_files=tuple(context_files),
            text_only=text_only,
            cache_breakpoints=cache_breakpoints,
            model=model,
            max_input_tokens=max_input_tokens,
            as_of=as_of,
            user_id=user_id,
        )
        return await self.run(self.recap.assemble, conversation_id, leaf=leaf, request=spec)

    async def record_usage(
        self,
        conversation_id: str,
        *,
        prompt_tokens: int,
        completion_tokens: int = 0,
        cached_tokens: int = 0,
        leaf: int | None = None,
        cache_write_tokens: int = 0,
    ) -> UsageRecorded:
        """``Recap.record_usage``: store the provider's usage for the request sent at ``leaf``."""
        return await self.run(
            self.recap.record_usage,
            conversation_id,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
            leaf=leaf,
            cache_write_tokens=cache_write_tokens,
        )

    async def stats(self, conversation_id: str, *, leaf: int | None = None) -> Stats:
        """``Recap.stats``: context pressure without calling any model."""
        return await self.run(self.recap.stats, conversation_id, leaf=leaf)

    async def export(
        self, conversation_id: str, *, leaf: int | None = None, full: bool = False
    ) -> ExportedConversation:
        """``Recap.export``: the branch as stored."""
        return await self.run(self.recap.export, conversation_id, leaf=leaf, full=full)

    async def summaries(self, conversation_id: str) -> list[SummaryInfo]:
        """``Recap.summaries``: the conversation's summaries, oldest first."""
        return await self.run(self.recap.summaries, conversation_id)

    async def recall(
        self, conversation_id: str, ref: str, *, offset: int = 0, max_chars: int | None = None
    ) -> Recalled:
        """``Recap.recall``: the original a ``ref=REF`` names, one page of it."""
        return await self.run(
            self.recap.recall, conversation_id, ref, offset=offset, max_chars=max_chars
        )

    async def pin(self, conversation_id: str, message_id: int) -> PinResult:
        """``Recap.pin``: send the message verbatim in every request of its branches."""
        return await self.run(self.recap.pin, conversation_id, message_id)

    async def unpin(self, conversation_id: str, message_id: int) -> PinResult:
        """``Recap.unpin``: undo ``pin``."""
        return await self.run(self.recap.unpin, conversation_id, message_id)

    async def attach(
        self, conversation_id: str, *, source: str, leaf: int | None = None
    ) -> Attached:
        """``Recap.attach``: attach another branch after the conversation's head."""
        return await self.run(self.recap.attach, conversation_id, source=source, leaf=leaf)

    async def merge(
        self,
        conversation_id: str,
        *,
        peers: Sequence[int | str],
        instruction: str,
        leaf: int | None = None,
        request: RequestSpec | None = None,
    ) -> MergeStarted:
        """``Recap.merge``: attach the peers and the instruction; the request to send."""
        return await self.run(
            functools.partial(
                self.recap.merge,
                conversation_id,
                peers=peers,
                instruction=instruction,
                leaf=leaf,
                request=request,
            )
        )

    async def merges(self, conversation_id: str) -> list[dict[str, Any]]:
        """``Recap.merges``: the conversation's merges, oldest first."""
        return await self.run(self.recap.merges, conversation_id)

    async def delete(self, conversation_id: str) -> dict[str, Any]:
        """``Recap.delete``: the conversation and everything derived from it."""
        return await self.run(self.recap.delete, conversation_id)

    def close(self) -> None:
        """Wait for running calls, then stop the pool's threads."""
        self._pool.shutdown(wait=True)

    async def __aenter__(self) -> AsyncRecap:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)
