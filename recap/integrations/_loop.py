"""The whole live loop around one model call of a framework adapter: assemble with the request's
real fixed parts (the system prompt, the tool schemas, the output reserve), record the usage the
provider reports for it, and answer a provider's context-length error by compressing and
assembling once more, never by sending the same request again.

``HostLoop`` is what the LangChain and Pydantic AI adapters keep per instance; the framework
glue (where the usage sits on a response, how a retry is made) stays in each adapter. Every
method blocks (database work, a compression run); the async adapters run them on
``AsyncRecap``'s thread pool.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from recap.core.client import Recap
from recap.core.overflow import chain as _chain
from recap.core.overflow import stated_tokens
from recap.integrations import _host

log = logging.getLogger("recap.integrations")

OVERFLOW_CODE = "context_length_exceeded"
# How providers word a request that does not fit (OpenAI and the servers copying it, Anthropic,
# Gemini, Mistral, vLLM, llama.cpp): matched in the error's text when no type or code says so.
OVERFLOW_WORDS = (
    "context_length_exceeded",
    "maximum context length",
    "context window",
    "context length",
    "prompt is too long",
    "input is too long",
    "too many tokens",
    "exceeds the context",
    "input token count",
)
OVERFLOW_TYPES = ("ContextOverflow", "ContextWindowExceeded", "ContextLengthExceeded")


@dataclass(frozen=True)
class Reading:
    """What the provider reported for one request: its input (cached tokens included), its
    output, and the input read from the prompt cache."""

    input_tokens: int
    output_tokens: int = 0
    cached_tokens: int = 0


def _code(exc: BaseException) -> str | None:
    for name in ("code", "provider_error_code"):
        value = getattr(exc, name, None)
        if isinstance(value, str):
            return value
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        error = body.get("error", body)
        code = error.get("code") if isinstance(error, Mapping) else None
        return code if isinstance(code, str) else None
    return None


def is_context_overflow(exc: BaseException) -> bool:
    """Whether the provider refused the request for not fitting its window: the framework's own
    error type for it, the ``context_length_exceeded`` code, or the provider's wording."""
    for error in _chain(exc):
        kinds = [kind.__name__ for kind in type(error).__mro__]
        if any(mark in kind for kind in kinds for mark in OVERFLOW_TYPES):
            return True
        if _code(error) == OVERFLOW_CODE:
            return True
        text = str(error).lower()
        if any(words in text for words in OVERFLOW_WORDS):
            return True
    return False


def openai_tool(name: str, description: str | None, parameters: Any) -> dict[str, Any]:
    """A tool as OpenAI's schema, the form Recap counts tools in."""
    function: dict[str, Any] = {"name": name, "parameters": parameters}
    if description:
        function["description"] = description
    return {"type": "function", "function": function}


class HostLoop:
    """One adapter's side of the loop, for the conversations it serves."""

    def __init__(
        self,
        recap: Recap,
        *,
        model: str | None = None,
        max_input_tokens: int | None = None,
        user_id: str | None = None,
    ) -> None:
        self.recap = recap
        self.user_id = user_id  # the user whose memory the requests carry (docs/memory.md)
        self.model = model
        self.max_input_tokens = max_input_tokens
        self._known: set[str] = set()  # conversations seen to exist
        self._reserves: dict[str, int | None] = {}  # the output reserve last set, by conversation

    def ensure(self, cid: str) -> str:
        """Create the conversation unless it is stored (once per conversation and instance)."""
        if cid not in self._known:
            _host.ensure_conversation(
                self.recap, cid, model=self.model, max_input_tokens=self.max_input_tokens
            )
            self._known.add(cid)
        return cid

    def assemble(
        self,
        cid: str,
        *,
        system: str | None,
        tools: list[dict[str, Any]] | None,
        reserve: int | None,
    ) -> _host.Assembled:
        """Recap's request for the head of the conversation, planned with the framework's real
        fixed parts; ``reserve`` is the reply's ``max_tokens`` when the framework sets one (the
        room kept free for it), None for Recap's own rule."""
        self.ensure(cid)
        if reserve != self._reserves.get(cid):  # a stored reserve stays until a call sets one
            self.recap.set_output_reserve(cid, reserve)
        self._reserves[cid] = reserve
        return _host.assemble(self.recap, cid, system=system, tools=tools, user_id=self.user_id)

    def record(self, cid: str, reading: Reading | None) -> None:
        """Store the provider's usage of the request last assembled for the conversation (the
        calibration learns from it). A reading that cannot be stored is logged: the turn goes on."""
        if reading is None or reading.input_tokens <= 0:
            return
        try:
            self.recap.record_usage(
                cid,
                prompt_tokens=reading.input_tokens,
                completion_tokens=max(reading.output_tokens, 0),
                cached_tokens=min(max(reading.cached_tokens, 0), reading.input_tokens),
            )
        except Exception as exc:  # the reply arrived: a failed write must not lose it
            log.warning("record_usage failed for %s: %s", cid, exc)

    def after_overflow(
        self,
        cid: str,
        error: BaseException,
        failed: _host.Assembled,
        *,
        system: str | None,
        tools: list[dict[str, Any]] | None,
        reserve: int | None,
    ) -> _host.Assembled | None:
        """The request to send after the provider refused ``failed`` as too large: the size the
        error states is recorded as a reading of it, the conversation compressed now, and the
        request assembled again. None when that request is the same as the refused one (there
        is nothing left to compress): the caller raises the provider's error then."""
        stated = stated_tokens(error)
        if stated is not None:
            self.record(cid, Reading(stated))
        try:
            self.recap.compress(cid, force=True)
        except Exception as exc:  # a failed run leaves the calibrated request to try
            log.warning("compressing %s after a context overflow failed: %s", cid, exc)
        again = self.assemble(cid, system=system, tools=tools, reserve=reserve)
        if again.history == failed.history:
            return None
        return again

    def enqueue(self, cid: str) -> None:
        """``compress_session`` for the conversation, on the broker of the settings."""
        _host.enqueue(self.recap, cid, user_id=self.user_id)
