"""One stored turn: map the resent history onto the tree, assemble the request, call the
upstream model (compressing once and retrying when it does not fit), store the reply, record
usage, enqueue compression.

Turns of one conversation run one at a time in this process (an asyncio lock per conversation,
held from the first read to the stored reply) and across processes (each write holds the
database's append lock), so two requests at once never fork the conversation. Database and
tokenizer work runs on ``AsyncRecap``'s thread pool: the event loop never waits on it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from recap.core import service
from recap.core.aio import AsyncRecap
from recap.core.errors import BudgetError
from recap.core.redact import error_text, known_secrets, redact
from recap.core.request.assembly import AssembledRequest
from recap.core.settings import Settings
from recap.core.storage import requests as history
from recap.core.storage.outputs import Ingest
from recap.core.values.request import RequestSpec
from recap.workers.serve import recall, upstream
from recap.workers.serve.errors import ServeError, client_text, context_too_long
from recap.workers.serve.headers import encoded

log = structlog.get_logger(__name__)


class ConversationLocks:
    """An asyncio lock per conversation, dropped when no request holds or awaits it."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}

    async def acquire(self, conversation_id: str) -> None:
        lock = self._locks.setdefault(conversation_id, asyncio.Lock())
        self._users[conversation_id] = self._users.get(conversation_id, 0) + 1
        try:
            await lock.acquire()
        except BaseException:
            self._leave(conversation_id)
            raise

    def release(self, conversation_id: str) -> None:
        self._locks[conversation_id].release()
        self._leave(conversation_id)

    def _leave(self, conversation_id: str) -> None:
        self._users[conversation_id] -= 1
        if self._users[conversation_id] == 0:
            del self._users[conversation_id], self._locks[conversation_id]

    def __len__(self) -> int:
        return len(self._locks)


@dataclass
class Turn:
    """A stored request, as read from the client and then placed on the tree."""

    conversation_id: str
    owner: history.Owner
    model: str
    system: str | None
    tools: list[dict[str, Any]] | None
    history: list[Any]  # as the client sent it; checked on the thread pool
    params: dict[str, Any]
    leaf_id: int | None = None
    sent: list[dict[str, Any]] = field(default_factory=list)
    room: int = 0  # tokens the assembled request leaves of its budget (workers.serve.recall)
    usage_response: Any = None  # the reply whose usage is recorded, when not the final one
    after: int | None = None  # ``history`` continues after this stored message (not resent)
    assembled: AssembledRequest | None = None  # Recap's last assembly for the turn
    recording: service.Recording | None = None  # what the assembly records, not yet written
    recorded: asyncio.Future[None] | None = None  # its write, under way while upstream answers
    # the reply as stored, from the upstream's message and reply (another API's spelling)
    reply_form: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None


class Turns:
    """Runs stored turns against one database and one upstream."""

    def __init__(self, recap: AsyncRecap, settings: Settings) -> None:
        self.recap = recap
        self.settings = settings
        self.ingest = Ingest.from_settings(settings)
        self.locks = ConversationLocks()
        self.seen = history.SeenRequests()
        self.upstream = upstream.Upstream(settings)
        self._secrets = known_secrets(settings)

    async def prepare(self, turn: Turn) -> history.Mapped:
        """The request's history on the tree and Recap's request for it (``turn.sent``), in one
        trip to the thread pool; compressing once, and assembling again, if it does not fit."""
        mapped, request = await self.recap.run(self._store_and_assemble, turn)
        turn.sent = request if request is not None else await self._compressed_and_assembled(turn)
        return mapped

    def _store_and_assemble(self, turn: Turn) -> tuple[history.Mapped, list[dict[str, Any]] | None]:
        engine = self.recap.recap.engine
        if turn.after is not None:
            mapped = history.store_after(
                engine, self.ingest, turn.conversation_id, turn.owner, turn.after, turn.history
            )
        else:
            mapped = history.store_request(
                engine, self.ingest, turn.conversation_id, turn.owner, turn.history, self.seen
            )
        turn.leaf_id = mapped.leaf_id
        spec = RequestSpec(system=turn.system, tools=self._tools(turn))
        try:
            assembled, turn.recording = self.recap.recap.assemble_unrecorded(
                turn.conversation_id, spec, leaf=turn.leaf_id
            )
        except BudgetError:
            return mapped, None
        turn.room = assembled.budget - assembled.tokens.total
        turn.assembled = assembled
        return mapped, assembled.messages

    def start_recording(self, turn: Turn) -> None:
        """Write what the turn's assembly records (``service.Recording``) on the thread pool
        while the upstream answers: the request goes out without waiting for the write."""
        recording, turn.recording = turn.recording, None
        if recording is not None:
            turn.recorded = asyncio.ensure_future(self.recap.run(recording.write))

    async def recorded(self, turn: Turn) -> None:
        """Wait for the turn's recording (before anything that reads it: compression, the
        usage, the reply's store, the next turn); a failed write is logged, never raised (the
        request is out: the next assembly records again)."""
        task, turn.recorded = turn.recorded, None
        if task is None:
            return
        try:
            await task
        except Exception as exc:
            log.warning("serve_recording_failed", error=self.error_text(exc))

    def _tools(self, turn: Turn) -> list[dict[str, Any]] | None:
        return recall.tools_for(turn.tools, self.settings)

    async def assemble(self, turn: Turn) -> list[dict[str, Any]]:
        """Recap's request for the branch, compressing once if it does not fit."""
        try:
            request = await self._assemble(turn)
        except BudgetError:
            request = await self._compressed_and_assembled(turn)
        turn.sent = request
        return request

    async def _compressed_and_assembled(self, turn: Turn) -> list[dict[str, Any]]:
        """Compress now, once, and assemble again; an OpenAI-format error if it still does not
        fit."""
        await self.compress_now(turn)
        try:
            return await self._assemble(turn)
        except BudgetError as exc:
            raise context_too_long(str(exc)) from None

    async def _assemble(self, turn: Turn) -> list[dict[str, Any]]:
        assembled = await self.recap.assemble(
            turn.conversation_id, leaf=turn.leaf_id, system=turn.system, tools=self._tools(turn)
        )
        turn.room = assembled.budget - assembled.tokens.total
        turn.assembled = assembled
        return assembled.messages

    async def call(self, turn: Turn, *, stream: bool) -> Any:
        """The upstream reply (or stream); a context overflow compresses once and retries."""
        if recall.enabled(self.settings, stream):
            return await recall.call_with_recall(self, turn)
        return await self.call_once(turn, stream=stream)

    async def call_once(self, turn: Turn, *, stream: bool) -> Any:
        """One upstream reply (or stream) for ``turn.sent``; a context overflow compresses once
        and retries."""
        try:
            return await self.upstream.complete(
                turn.model, turn.sent, capped_params(turn), stream=stream
            )
        except Exception as exc:
            if not upstream.is_context_overflow(exc):
                raise upstream.as_serve_error(exc, self.settings) from None
        await self.compress_now(turn)
        await self.assemble(turn)
        try:
            return await self.upstream.complete(
                turn.model, turn.sent, capped_params(turn), stream=stream
            )
        except Exception as exc:
            raise upstream.as_serve_error(exc, self.settings) from None

    async def compress_now(self, turn: Turn) -> None:
        """The synchronous compression: summarize now so the next assembly fits."""
        await self.recorded(turn)
        outcome = await self.recap.compress(turn.conversation_id, leaf=turn.leaf_id, force=True)
        log.info(
            "serve_compressed_now",
            conversation_id=turn.conversation_id,
            action=outcome.get("action"),
            reason=outcome.get("reason"),
        )

    @property
    def secrets(self) -> list[str]:
        """The known secrets every reply and error is masked of."""
        return self._secrets

    async def finish(self, turn: Turn, response: Any) -> int:
        """Store the reply and its usage (one trip to the thread pool); the reply's id. The
        reply is read and checked first (``upstream.read_reply``: a ``MalformedReply`` before
        anything is stored) unless it is a ``Completion`` already."""
        completion = self.completion(response)
        await self.recorded(turn)
        return await self.recap.run(self._finish, turn, completion)

    def completion(self, response: Any, *, storable: bool = True) -> upstream.Completion:
        """The reply read, checked and masked (a ``MalformedReply`` when it is no reply, or
        with ``storable`` one that cannot be stored)."""
        if isinstance(response, upstream.Completion):
            return response
        return upstream.read_reply(response, self._secrets, storable=storable)

    async def finish_stream(self, turn: Turn, chunks: list[Any] | dict[str, Any]) -> Any:
        """Store the reply of a finished stream: the relay's whole reply, or the reply its
        ``chunks`` assemble (built on the thread pool, not the event loop); the reply, whose
        usage ``record_usage`` records."""
        await self.recorded(turn)
        return await self.recap.run(self._finish_stream, turn, chunks)

    async def record_usage(self, turn: Turn, response: Any) -> None:
        """The usage the provider reported for the turn, when it did (called once the turn's
        recording is written: ``stored_turn`` awaits it before letting the conversation go)."""
        await self.recap.run(self._record_usage, turn, response)

    def _finish(self, turn: Turn, completion: upstream.Completion) -> int:
        reply_id = self._store_reply(turn, completion.message, json.loads(completion.body))
        try:  # the reply is stored: nothing after it may fail the turn
            self._record_usage(turn, completion)
        except Exception as exc:
            log.warning("serve_usage_not_recorded", error=self.error_text(exc))
        return reply_id

    def _finish_stream(self, turn: Turn, chunks: list[Any] | dict[str, Any]) -> Any:
        response = (
            chunks if isinstance(chunks, dict) else upstream.build_from_chunks(chunks, turn.sent)
        )
        message = upstream.read_reply(response, self._secrets).message
        self._store_reply(turn, message, response)
        return response

    def _store_reply(self, turn: Turn, message: dict[str, Any], response: Any = None) -> int:
        if turn.reply_form is not None:  # another API's spelling of the reply
            message = turn.reply_form(message, response)
        return history.store_reply(
            self.recap.recap.engine,
            self.ingest,
            turn.conversation_id,
            turn.owner,
            turn.leaf_id,
            message,
            self.seen,
        )

    def _record_usage(self, turn: Turn, response: Any) -> None:
        source = turn.usage_response or response
        if isinstance(source, upstream.Completion):
            usage = source.usage
        else:
            usage = upstream.usage_of(source)
        if usage is not None:
            prompt, completion, cached = usage
            self.recap.recap.record_usage(
                turn.conversation_id,
                prompt_tokens=prompt,
                completion_tokens=completion,
                cached_tokens=cached,
                leaf=turn.leaf_id,
            )

    async def enqueue(self, conversation_id: str, leaf_id: int | None) -> None:
        """``recap.compress_session`` for the workers; a broker outage is logged, not raised:
        the reply is already out, and reconcile picks the conversation up later."""
        try:
            await self.recap.run(_send_compress, conversation_id, leaf_id)
        except Exception as exc:
            log.warning(
                "serve_enqueue_failed",
                conversation_id=conversation_id,
                error=error_text(exc, self._secrets),
            )

    def error_text(self, exc: BaseException) -> str:
        """One masked line naming the error's class, for logs."""
        return error_text(exc, self._secrets)

    def masked(self, exc: BaseException) -> str:
        """The error's message for the client: every secret masked, one line, no traceback
        and no server path."""
        return client_text(redact(str(exc), self._secrets))


def _send_compress(conversation_id: str, leaf_id: int | None) -> None:
    """Enqueue on the configured broker, routed as the workers expect."""
    from recap.workers.enqueue import compress_later

    compress_later(conversation_id, leaf_id)


def reply_headers(turn: Turn) -> Mapping[str, str]:
    """What the response says about the stored turn, and what Recap sent for it, every value
    encoded by the header rule (``headers.encode``: an id of any script is percent-encoded)."""
    headers = {"X-Recap-Mode": "stored", "X-Recap-Conversation": turn.conversation_id}
    if turn.assembled is not None:
        headers.update(outcome_headers(turn.assembled))
        headers.update(cap_headers(turn))
    return encoded(headers)  # every value by the header rule: a conversation id of any script


REPLY_LIMITS = ("max_tokens", "max_completion_tokens")  # the client's cap on the reply


def capped_params(turn: Turn) -> dict[str, Any]:
    """The client's parameters with its reply limit cut to the room the request leaves for the
    reply (``AssembledRequest.max_output_tokens``): a larger one is an overflow the provider
    would refuse or cut. A limit the client did not set is left to the provider."""
    room = turn.assembled.max_output_tokens if turn.assembled is not None else None
    if room is None:
        return turn.params
    params = dict(turn.params)
    for key in REPLY_LIMITS:
        value = params.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > room:
            params[key] = max(room, 1)
    return params


def cap_headers(turn: Turn) -> dict[str, str]:
    """The room for the reply, and whether the client's limit was cut to it."""
    room = turn.assembled.max_output_tokens if turn.assembled is not None else None
    if room is None:
        return {}
    asked = [turn.params.get(key) for key in REPLY_LIMITS]
    capped = any(isinstance(v, int) and not isinstance(v, bool) and v > room for v in asked)
    return {
        "X-Recap-Max-Output-Tokens": str(room),
        "X-Recap-Max-Tokens-Capped": "true" if capped else "false",
    }


def outcome_headers(assembled: AssembledRequest) -> dict[str, str]:
    """Whether older history was left out to fit (and how many messages), the summary the
    request starts from, and Recap's count of the request's tokens."""
    summary = assembled.summary_id
    return {
        "X-Recap-Truncated": "true" if assembled.truncated else "false",
        "X-Recap-Dropped-Messages": str(len(assembled.dropped_message_ids)),
        "X-Recap-Summary-Id": str(summary) if summary is not None else "none",
        "X-Recap-Request-Tokens": str(assembled.tokens.total),
    }


__all__ = ["ConversationLocks", "ServeError", "Turn", "Turns", "reply_headers"]
