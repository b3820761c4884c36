"""What the host asks of one request, as one frozen value: ``RequestSpec``.

The host's own parts of a request (its system prompt, tools, reminder and context files), how it
wants the request rendered (text only, cache marks) and which request it wants (another model to
preview, a window of its own, the request as it was at a past moment) travel together from
``Recap.assemble`` down to ``core.request.assembly.assemble``. Every layer takes this one value
instead of retyping the parts as parameters, and the value checks its fields once, here, when it
is made.

``Recap.assemble``'s keyword arguments build the value (``request_from``); a host may build it
itself and pass ``request=`` instead, for instance to reuse one set of parts across turns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypedDict, Unpack

from recap.core.errors import InputError


@dataclass(frozen=True, slots=True)
class ContextFile:
    """A file (or the agent prompt) the model should see just before the last user message."""

    name: str
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestSpec:
    """The request a host asks for: its parts, how to render them, and for which model, window
    and moment.

    ``system`` replaces the conversation's stored system prompt; ``tools`` are the tool schemas
    (counted, not sent: the host sends them itself); ``reminder`` is sent as the last message;
    ``context_files`` just before the last user message, each kept or left out whole.
    ``text_only`` renders tool turns as plain text; ``cache_breakpoints`` adds Anthropic-style
    cache marks (None: for Anthropic models only). ``model`` previews the request for another
    model (its window and tokenizer) without changing the conversation's;
    ``max_input_tokens`` overrides the window for this request; ``as_of`` builds the request as
    it was at that moment (kept in UTC; a naive time is taken as UTC). ``user_id`` names the
    user the request is for: their memory is sent with it (``RECAP_MEMORY``, see
    ``core.request.memory``).
    """

    system: str | None = None
    tools: Sequence[Mapping[str, Any]] | None = None
    reminder: str | None = None
    context_files: Sequence[ContextFile] = ()  # kept as a tuple
    text_only: bool = False
    cache_breakpoints: bool | None = None
    model: str | None = None
    max_input_tokens: int | None = None
    as_of: datetime | None = None
    user_id: str | None = None

    def __post_init__(self) -> None:
        """Check the fields once, and keep the sequences as tuples (the value stays frozen)."""
        if self.max_input_tokens is not None and self.max_input_tokens <= 0:
            raise InputError(f"--max-input-tokens must be positive, got {self.max_input_tokens}")
        if self.tools is not None and not isinstance(self.tools, tuple):
            object.__setattr__(self, "tools", tuple(self.tools))
        if not isinstance(self.context_files, tuple):
            object.__setattr__(self, "context_files", tuple(self.context_files))
        if self.as_of is not None:
            object.__setattr__(self, "as_of", _as_utc(self.as_of))
        if self.user_id is not None:
            from recap.core.values.memory import check_user

            object.__setattr__(self, "user_id", check_user(self.user_id))


class RequestParts(TypedDict, total=False):
    """``RequestSpec``'s fields as keyword arguments (``Recap.assemble``'s, the CLI's)."""

    system: str | None
    tools: Sequence[Mapping[str, Any]] | None
    reminder: str | None
    context_files: Sequence[ContextFile]
    text_only: bool
    cache_breakpoints: bool | None
    model: str | None
    max_input_tokens: int | None
    as_of: datetime | None
    user_id: str | None


NO_PARTS = RequestSpec()  # what a request given no parts asks for


def request_from(request: RequestSpec | None, **parts: Unpack[RequestParts]) -> RequestSpec:
    """The request value a call asks for: ``request`` when given, else the one its keyword
    ``parts`` build. Giving the value and a part besides it (one that differs from its default)
    is an ``InputError``: the part would otherwise be silently ignored."""
    built = RequestSpec(**parts)
    if request is None:
        return built
    if built != NO_PARTS:
        named = ", ".join(name for name in parts if getattr(built, name) != getattr(NO_PARTS, name))
        raise InputError(f"give the request value or its parts ({named}), not both")
    return request


def _as_utc(moment: datetime) -> datetime:
    """A moment in UTC (a naive one is taken as UTC), as every stored time is."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)
