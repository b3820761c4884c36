"""One stored turn: map the resent history onto the tree, assemble the request, call the
upstream model (compressing once and retrying when it does not fit), store the reply, record
usage, enqueue compression.

Conversation ids are scoped per client key: the name a request gives is resolved to the
conversation of that key (``core.service.serving.resolve``) before anything waits, so a
request never queues behind another key's. Turns of one key's conversation run one at a time
in this process (an asyncio lock per key and name, held from the first read to the stored
reply) and across processes (each write holds the database's append lock), so two requests at
once never fork the conversation. Database and tokenizer work runs on ``AsyncRecap``'s thread
pool: the event loop never waits on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from recap.core import overflow, service, tracing
from recap.core.aio import AsyncRecap
from recap.core.errors import BudgetError, NotFoundError
from recap.core.redact import error_text, known_secrets, redact
from recap.core.request.assembly import AssembledRequest
from recap.core.service import Ingest, serving
from recap.core.settings import Settings
from recap.core.values.request import RequestSpec
from recap.core.values.serving import Mapped, Owner, Resolved
from recap.workers.serve import direct, metrics, recall, upstream
from recap.workers.serve import tracing as serve_tracing
from recap.workers.serve.errors import ServeError, client_text, context_too_long, not_found
from recap.workers.serve.headers import encoded
from recap.workers.serve.locks import ConversationLocks, ResolvedNames
from recap.workers.serve.replies import Chunk, ChunkStream, Reply

log = structlog.get_logger(__name__)

Answer = upstream.Completion | Reply | ChunkStream  # a native reply, a chat reply, its stream
Streamed = upstream.Completion | Mapping[str, Any] | Sequence[Chunk]  # a finished stream
Stored = upstream.Completion | Reply | Mapping[str, Any]  # a stored reply, its usage to record


def whole(answer: Answer) -> upstream.Completion | Reply:
    """The answer to a request that asked for no stream: a whole reply."""
    if isinstance(answer, upstream.Completion | Reply):
        return answer
    raise AssertionError("a stream answered a request that asked for none")


@dataclass(kw_only=True)
class Turn:
    """A stored request, as read from the client and then placed on the tree.

    ``name`` is the conversation as the client names it (what its headers and response ids
    say); ``conversation_id`` the id it is stored under for this key (``Turns.resolve``), the
    name itself until resolved."""

    conversation_id: str
    owner: Owner
    model: str
    system: str | None
    tools: list[dict[str, Any]] | None
    history: list[Any]  # as the client sent it; checked on the thread pool
    params: dict[str, Any]
    leaf_id: int | None = None
    sent: list[dict[str, Any]] = field(default_factory=list)
    room: int = 0  # tokens the assembled request leaves of its budget (workers.serve.recall)
    usage_response: Reply | None = None  # the reply whose usage is recorded, when not the final

    after: int | None = None  # ``history`` continues after this stored message (not resent)
    assembled: AssembledRequest | None = None  # Recap's last assembly for the turn
    recording: service.Recording | None = None  # what the assembly records, not yet written
    recorded: asyncio.Future[None] | None = None  # its write, under way while upstream answers
    # the reply as stored, from the upstream's message and reply (another API's spelling)
    reply_form: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None
    name: str = ""  # the client's name of the conversation (default: ``conversation_id``)
    stream: bool = False  # streamed: sent without ``recap_recall`` (``recall.enabled``)
    native: Any = None  # the API's own dialect upstream (``workers.serve.native``), if sent so
    user_id: str | None = None  # the user whose memory it carries, scoped to the key

    def __post_init__(self) -> None:
        self.name = self.name or self.conversation_id

    @property
    def key(self) -> tuple[str, str]:
        """The conversation as this process locks and remembers it: the key and the name."""
        return (self.owner.fingerprint, self.name)


class Turns:
    """Runs stored turns against one database and one upstream."""

    def __init__(self, recap: AsyncRecap, settings: Settings) -> None:
        self.recap = recap
        self.settings = settings
        self.ingest = Ingest.from_settings(settings)
        self.locks = ConversationLocks()
        self.names = ResolvedNames()
        self.seen = serving.SeenRequests()
        self.upstream = upstream.Upstream(settings)
        self._secrets = known_secrets(settings)

    async def resolve(self, turn: Turn) -> None:
        """The conversation the turn's name means for its key (``turn.conversation_id``),
        checked before the turn takes any lock or waits for anything: another key's
        conversation of the same name is never this turn's, and never delays it."""
        found = self.names.get(turn.key)
        if found is None:
            found = (await self.lookup(turn.owner.fingerprint, turn.name)).conversation_id
        turn.conversation_id = found

    async def lookup(self, fingerprint: str, name: str) -> Resolved:
        """Where the key's conversation ``name`` is stored (``serving.resolve``); a 404 when it
        cannot be this key's."""
        try:
            return await self.recap.run(serving.resolve, self.recap.recap.engine, name, fingerprint)
        except NotFoundError:
            raise not_found(name) from None

    async def stored_id(self, fingerprint: str, name: str) -> str:
        """The id the key's existing conversation ``name`` is stored under, once a turn of the
        key on it under way in this process has settled (an id given at a stream's start names
        its reply once it is stored); a ``NotFoundError`` when the key has no such conversation
        (another key's, or none)."""
        await self.locks.settled((fingerprint, name))
        try:
            resolved = await self.lookup(fingerprint, name)
        except ServeError:
            raise NotFoundError(name) from None
        if not resolved.exists:
            raise NotFoundError(name)
        return resolved.conversation_id

    async def prepare(self, turn: Turn) -> Mapped:
        """The request's history on the tree and Recap's request for it (``turn.sent``), in one
        trip to the thread pool; compressing once, and assembling again, if it does not fit."""
        mapped, request = await self.recap.run(self._store_and_assemble, turn)
        self.names.put(turn.key, turn.conversation_id)
        turn.sent = request if request is not None else await self._compressed_and_assembled(turn)
        metrics.assembled(turn.assembled)
        return mapped

    def _store_and_assemble(self, turn: Turn) -> tuple[Mapped, list[dict[str, Any]] | None]:
        try:
            mapped = self._store(turn)
        except NotFoundError:  # the id is another key's now: the name is resolved again, once
            if turn.after is not None:
                raise
            engine = self.recap.recap.engine
            resolved = serving.resolve(engine, turn.name, turn.owner.fingerprint)
            if resolved.conversation_id == turn.conversation_id:
                raise
            turn.conversation_id = resolved.conversation_id
            mapped = self._store(turn)
        turn.leaf_id = mapped.leaf_id
        spec = RequestSpec(
            system=turn.system,
            tools=self._tools(turn),
            user_id=turn.user_id,
            **self._for_model(turn),
        )
        try:
            assembled, turn.recording = self.recap.recap.assemble_unrecorded(
                turn.conversation_id, spec, leaf=turn.leaf_id
            )
        except BudgetError:
            return mapped, None
        turn.room = assembled.budget - assembled.tokens.total
        turn.assembled = assembled
        turn.params = self.upstream.with_cache_hints(
            turn.model, turn.params, assembled.cache_params()
        )
        return mapped, assembled.messages

    def _store(self, turn: Turn) -> Mapped:
        engine = self.recap.recap.engine
        with tracing.span("recap.read", {"recap.conversation_id": turn.conversation_id}) as span:
            if turn.after is not None:
                mapped = serving.store_after(
                    engine, self.ingest, turn.conversation_id, turn.owner, turn.after, turn.history
                )
            else:
                mapped = serving.store_request(
                    engine, self.ingest, turn.conversation_id, turn.owner, turn.history, self.seen
                )
            span.set_attributes(
                {"recap.matched": mapped.matched, "recap.appended": len(mapped.appended)}
            )
        return mapped

    def start_recording(self, turn: Turn) -> None:
        """Write what the turn's assembly records (``service.Recording``) on the thread pool:
        the request goes out without waiting for the write (``stored_turn`` starts it while the
        upstream answers, or a streamed turn once its first chunk is out; ``recorded`` starts it
        when neither has yet)."""
        recording, turn.recording = turn.recording, None
        if recording is not None:
            turn.recorded = asyncio.ensure_future(self.recap.run(recording.write))

    async def recorded(self, turn: Turn) -> None:
        """Wait for the turn's recording (before anything that reads it: compression, the
        usage, the reply's store, the next turn); a failed write is logged, never raised (the
        request is out: the next assembly records again)."""
        self.start_recording(turn)  # not started yet: a stream before its first chunk
        task, turn.recorded = turn.recorded, None
        if task is None:
            return
        try:
            await task
        except Exception as exc:
            log.warning("serve_recording_failed", error=self.error_text(exc))

    def _for_model(self, turn: Turn) -> dict[str, Any]:
        """A native turn is assembled for the model it calls (its provider items are that
        model's: ``core.counting.reasoning.items_sent``), in the window recap serve gives it."""
        if turn.native is None:
            return {}
        return {"model": turn.model, "max_input_tokens": self.settings.serve_max_input_tokens}

    def _tools(self, turn: Turn) -> list[dict[str, Any]] | None:
        """The tools the turn is assembled and counted with: ``recap_recall`` only when the
        turn is sent with it (so a cleared result's placeholder names it only then)."""
        if turn.native is not None or not recall.enabled(self.settings, turn.stream):
            return turn.tools
        return recall.tools_for(turn.tools, self.settings)

    async def _compressed_and_assembled(self, turn: Turn) -> list[dict[str, Any]]:
        """Compress now, once, and assemble again; an OpenAI-format error if it still does not
        fit."""
        await self.compress_now(turn)
        try:
            return await self._assemble(turn)
        except BudgetError as exc:
            raise context_too_long(str(exc)) from None

    async def _assemble(self, turn: Turn) -> list[dict[str, Any]]:
        await self.assemble_for(turn)
        return turn.sent

    async def call(self, turn: Turn, *, stream: bool) -> Answer:
        """The upstream reply (or stream); a context overflow compresses once and retries."""
        if turn.native is None and recall.enabled(self.settings, stream):
            return await recall.call_with_recall(self, turn)
        return await self.call_once(turn, stream=stream)

    async def call_once(self, turn: Turn, *, stream: bool) -> Answer:
        """One upstream reply (or stream) for ``turn.sent``; a context overflow is answered by
        a smaller request (``refit``), sent once, or by the provider's error when nothing
        smaller could be made: the refused request is never sent again."""
        try:
            return await self._send(turn, stream)
        except Exception as exc:
            if not upstream.is_context_overflow(exc):
                raise upstream.as_serve_error(exc, self.settings) from None
            refused = exc
        if not await self.refit(turn, refused):
            raise upstream.as_serve_error(refused, self.settings) from None
        try:
            return await self._send(turn, stream)
        except Exception as exc:
            raise upstream.as_serve_error(exc, self.settings) from None

    async def _send(self, turn: Turn, stream: bool) -> Answer:
        """``turn.sent`` upstream: in the turn's native dialect (a whole reply, streamed to the
        client from it), else as chat completions."""
        if turn.native is not None:
            completion = await self.upstream.native_call(
                turn.native, turn.sent, capped_params(turn)
            )
            report = turn.native.report
            if report.sent or report.left_out:
                log.info(
                    "serve_provider_items",
                    conversation_id=turn.conversation_id,
                    sent=report.sent,
                    left_out=report.left_out,
                )
            return completion
        return await self.upstream.complete(
            turn.model, turn.sent, capped_params(turn), stream=stream
        )

    async def refit(self, turn: Turn, error: BaseException) -> bool:
        """After the provider refused ``turn.sent`` as too large: the size its error states is
        recorded as a reading of that request (the calibration learns from it), the
        conversation compressed now, and the request assembled again; when that is the same
        request, assembled once more for a window shrunk by the share the provider stated it
        was over (``tighter_window``). Whether ``turn.sent`` is a different request now."""
        failed, assembled = turn.sent, turn.assembled
        await self.recorded(turn)
        stated = overflow.stated_tokens(error)
        if stated is not None:
            await self.record_reading(turn, stated)
        await self.compress_now(turn)
        limit = overflow.stated_limit(error)
        with contextlib.suppress(BudgetError):
            await self.assemble_for(turn)
            if turn.sent != failed and fits(turn.assembled, assembled, stated, limit):
                return True
        if assembled is None:
            return turn.sent != failed
        window = tighter_window(assembled, stated, limit)
        try:
            await self.assemble_for(turn, max_input_tokens=window)
        except BudgetError:
            return False
        log.info(
            "serve_overflow_tighter_window",
            conversation_id=turn.conversation_id,
            window=window,
            changed=turn.sent != failed,
        )
        return turn.sent != failed

    async def record_reading(self, turn: Turn, prompt_tokens: int) -> None:
        """The provider's count of the refused request, recorded as its usage (no reply)."""
        try:
            await self.recap.record_usage(
                turn.conversation_id, prompt_tokens=prompt_tokens, leaf=turn.leaf_id
            )
        except Exception as exc:  # a reading that cannot be stored must not fail the turn
            log.warning("serve_usage_not_recorded", error=self.error_text(exc))

    async def assemble_for(self, turn: Turn, *, max_input_tokens: int | None = None) -> None:
        """Assemble the turn's request again (``turn.sent``), for a smaller window when given."""
        target = self._for_model(turn)
        if max_input_tokens is not None:
            target["max_input_tokens"] = max_input_tokens
        assembled = await self.recap.assemble(
            turn.conversation_id,
            leaf=turn.leaf_id,
            system=turn.system,
            tools=self._tools(turn),
            **target,
            user_id=turn.user_id,
        )
        turn.room = assembled.budget - assembled.tokens.total
        turn.assembled = assembled
        turn.params = self.upstream.with_cache_hints(
            turn.model, turn.params, assembled.cache_params()
        )
        turn.sent = assembled.messages

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

    async def finish(self, turn: Turn, response: upstream.Completion | Reply) -> int:
        """Store the reply and its usage (one trip to the thread pool); the reply's id. The
        reply is read and checked first (``upstream.read_reply``: a ``MalformedReply`` before
        anything is stored) unless it is a ``Completion`` already."""
        completion = self.completion(response)
        await self.recorded(turn)
        return await self.recap.run(self._finish, turn, completion)

    def completion(
        self, response: upstream.Completion | Reply, *, storable: bool = True
    ) -> upstream.Completion:
        """The reply read, checked and masked (a ``MalformedReply`` when it is no reply, or
        with ``storable`` one that cannot be stored)."""
        if isinstance(response, upstream.Completion):
            return response
        return upstream.read_reply(response, self._secrets, storable=storable)

    async def finish_stream(self, turn: Turn, chunks: Streamed) -> Stored:
        """Store the reply of a finished stream: the relay's whole reply, or the reply its
        ``chunks`` assemble (built on the thread pool, not the event loop); the reply, whose
        usage ``record_usage`` records."""
        await self.recorded(turn)
        return await self.recap.run(self._finish_stream, turn, chunks)

    async def record_usage(self, turn: Turn, response: Stored) -> None:
        """The usage the provider reported for the turn, when it did (called once the turn's
        recording is written: ``stored_turn`` awaits it before letting the conversation go)."""
        await self.recap.run(self._record_usage, turn, response)

    def _finish(self, turn: Turn, completion: upstream.Completion) -> int:
        with tracing.span("recap.store", {"recap.conversation_id": turn.conversation_id}) as span:
            reply_id = self._store_reply(turn, completion.message, json.loads(completion.body))
            span.set_attribute("recap.reply_id", reply_id)
            try:  # the reply is stored: nothing after it may fail the turn
                self._record_usage(turn, completion)
            except Exception as exc:
                log.warning("serve_usage_not_recorded", error=self.error_text(exc))
        return reply_id

    def _finish_stream(self, turn: Turn, chunks: Streamed) -> Stored:
        with tracing.span("recap.store", {"recap.conversation_id": turn.conversation_id}) as span:
            if isinstance(chunks, upstream.Completion):  # a native reply, streamed from its whole
                span.set_attribute("recap.reply_id", self._store_reply(turn, chunks.message))
                return chunks
            response = chunks if isinstance(chunks, Mapping) else direct.build_from_chunks(chunks)
            message = upstream.read_reply(response, self._secrets).message
            for call in serve_tracing.streams_ended():  # the stream's call, with its usage
                upstream.traced_reply(call, response)
                call.end()
            span.set_attribute("recap.reply_id", self._store_reply(turn, message, response))
        return response

    def _store_reply(self, turn: Turn, message: dict[str, Any], response: Any = None) -> int:
        if turn.reply_form is not None:  # another API's spelling of the reply
            message = turn.reply_form(message, response)
        return serving.store_reply(
            self.recap.recap.engine,
            self.ingest,
            turn.conversation_id,
            turn.owner,
            turn.leaf_id,
            message,
            self.seen,
        )

    def _record_usage(self, turn: Turn, response: Stored) -> None:
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

    async def enqueue(
        self, conversation_id: str, leaf_id: int | None, user_id: str | None = None
    ) -> None:
        """``recap.compress_session`` for the workers (and ``recap.extract_memories`` of the
        turn's user); a broker outage is logged, not raised: the reply is already out, and
        reconcile picks the conversation up later."""
        try:
            await self.recap.run(_send_compress, conversation_id, leaf_id, user_id)
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


def _send_compress(conversation_id: str, leaf_id: int | None, user_id: str | None) -> None:
    """Enqueue on the configured broker, routed as the workers expect."""
    from recap.workers.enqueue import compress_later

    compress_later(conversation_id, leaf_id, user_id=user_id)


def reply_headers(turn: Turn) -> Mapping[str, str]:
    """What the response says about the stored turn, and what Recap sent for it, every value
    encoded by the header rule (``headers.encode``: an id of any script is percent-encoded)."""
    headers = {"X-Recap-Mode": "stored", "X-Recap-Conversation": turn.name}
    if turn.assembled is not None:
        headers.update(outcome_headers(turn.assembled))
        headers.update(cap_headers(turn))
    if turn.native is not None:
        headers.update(turn.native.report.headers())
    return encoded(headers)  # every value by the header rule: a conversation id of any script


SHRINK = 0.75  # what a refit's last try keeps of the request when the error states no sizes
MARGIN = 0.9  # what it keeps of the share the stated sizes allow


def fits(
    again: AssembledRequest | None,
    refused: AssembledRequest | None,
    stated: int | None,
    limit: int | None,
) -> bool:
    """Whether the request assembled again is small enough for the provider by the sizes its
    error stated (the refused request's tokens scaled by ``limit / stated``); true when it
    stated none."""
    if again is None or refused is None or not stated or not limit or limit >= stated:
        return True
    return again.tokens.total <= refused.tokens.total * limit / stated * MARGIN


def tighter_window(assembled: AssembledRequest, stated: int | None, limit: int | None) -> int:
    """The window a refused request is assembled for at last: one whose budget holds the
    request's tokens scaled by the provider's window over the size it stated (``limit /
    stated``, with a margin), or by ``SHRINK`` when the error states neither; always smaller
    than the refused request's window."""
    keep = SHRINK
    if stated and limit and limit < stated:
        keep = min(SHRINK, limit / stated * MARGIN)
    fill = min(assembled.tokens.total / assembled.budget, 1.0) if assembled.budget > 0 else 1.0
    return max(1, int(assembled.window * fill * keep))


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


__all__ = ["ConversationLocks", "ResolvedNames", "ServeError", "Turn", "Turns", "reply_headers"]
