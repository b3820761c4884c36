"""The provider's own compaction of a span, beside Recap's readable summary of it
(``RECAP_PROVIDER_COMPACTION=auto``).

Where the conversation's model offers it, a run that summarizes a span also asks the provider to
compact the same span (the previous summary and the messages up to the new cutoff) and stores
what the provider returns on the summary row (``summaries.provider_items``), beside the text:

- OpenAI (and Azure OpenAI) models (``openai/...``, ``azure/...`` or a bare OpenAI name):
  ``POST {RECAP_UPSTREAM_API_BASE}/responses/compact`` with the span as Responses input items;
  the reply's ``output`` (the user messages it keeps verbatim, then its opaque ``compaction``
  item) is the provider's form of the span, stored item by item.
- Anthropic models: ``POST .../v1/messages`` with the ``compact-2026-01-12`` beta, a
  ``compact_20260112`` context-management edit that pauses after compacting; the reply's
  ``compaction`` blocks are stored. Anthropic compacts only from its minimum trigger
  (``ANTHROPIC_MIN_TRIGGER`` input tokens): a smaller span is not asked.

Assembly (``core.request.assembly.parts.summary_part``) sends these items, byte for byte, to
requests for that provider and model on the native dialects of ``recap serve``, and the readable
summary everywhere else. Any failure (no upstream configured, an HTTP error, a timeout, a reply
of another shape) leaves the readable summary alone in place: the run's outcome is unchanged but
for a note in its reason, the failure is logged and counted (``PROVIDER_COMPACTION`` events).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from recap.core.compression.report import PROVIDER_COMPACTION
from recap.core.counting import providers, reasoning
from recap.core.redact import known_secrets, redact
from recap.core.request.native_anthropic import anthropic_input
from recap.core.request.native_items import (
    SUMMARY_ITEMS_KEY,
    dumps,
    provider_item,
    stored_items,
)
from recap.core.request.native_openai import responses_input
from recap.core.settings import Settings
from recap.core.summaries.planning import Split
from recap.core.summaries.prompts import SUMMARY_MESSAGE_PREFIX
from recap.core.values.records import SYSTEM_ROLES

if TYPE_CHECKING:
    from recap.core.compression.run import Run, Snapshot

RESPONSES, MESSAGES = "responses", "messages"
KIND = "compaction"  # the provider items' kind: never under the thinking window
ANTHROPIC_BETA = "compact-2026-01-12"
ANTHROPIC_EDIT = "compact_20260112"
ANTHROPIC_VERSION = "2023-06-01"
ANTHROPIC_MIN_TRIGGER = 50_000  # input tokens: Anthropic's smallest compaction trigger
ANTHROPIC_MAX_TOKENS = 4_096
OPENAI_PREFIXES = ("", "openai", "azure")  # a model string's litellm prefix
PREFIXES = ("openai/", "azure/", "anthropic/")  # litellm's prefixes the provider never sees
ERROR_CHARS = 200

counts: dict[str, int] = {"ok": 0, "failed": 0}  # this process's attempts, by outcome


class CompactionFailed(Exception):
    """The provider's compaction did not give a usable item; the readable summary stands."""


def dialect(settings: Settings, model: str) -> str | None:
    """The API the run asks ``model``'s provider to compact in, None where it does not (the
    setting off, no upstream, or a provider without compaction)."""
    if settings.provider_compaction != "auto" or not settings.upstream_api_base or not model:
        return None
    provider = providers.provider_of(model)
    if provider == providers.ANTHROPIC:
        return MESSAGES
    prefix = model.split("/", 1)[0] if "/" in model else ""
    if provider == providers.OPENAI and prefix in OPENAI_PREFIXES:
        return RESPONSES  # an OpenAI or Azure model (a bare name is OpenAI's, as litellm reads it)
    return None


def upstream_name(model: str) -> str:
    for prefix in PREFIXES:
        if model.startswith(prefix):
            return model[len(prefix) :]
    return model


def span_messages(snapshot: Snapshot, split: Split, model: str) -> list[dict[str, Any]]:
    """The span a summary replaces, as chat messages for ``model``: the previous summary (its
    provider items, where they are this model's, else its text) and the older messages (their
    provider items of this model kept), system messages left out (requests send them apart)."""
    out: list[dict[str, Any]] = []
    previous = snapshot.summary
    if previous is not None:
        message: dict[str, Any] = {
            "role": "user",
            "content": SUMMARY_MESSAGE_PREFIX + previous.text,
        }
        items = [i for i in stored_items(previous.provider_items) if reasoning.same_model(i, model)]
        if items:
            message[SUMMARY_ITEMS_KEY] = items
        out.append(message)
    for row in split.older:
        if row.role in SYSTEM_ROLES:
            continue
        sent = reasoning.as_sent(
            row.to_openai(), reasoning.family_of(model), in_progress=False, model=model
        )
        out.append({k: v for k, v in sent.items() if k != reasoning.LEFT_OUT_KEY})
    return out


def request(kind: str, model: str, messages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The compaction request's body for the span ``messages``."""
    if kind == RESPONSES:
        _instructions, items = responses_input(messages, model)
        return {"model": upstream_name(model), "input": items}
    _system, turns = anthropic_input(messages, model)
    edit = {
        "type": ANTHROPIC_EDIT,
        "trigger": {"type": "input_tokens", "value": ANTHROPIC_MIN_TRIGGER},
        "pause_after_compaction": True,
    }
    return {
        "model": upstream_name(model),
        "max_tokens": ANTHROPIC_MAX_TOKENS,
        "messages": turns,
        "context_management": {"edits": [edit]},
    }


def endpoint(settings: Settings, kind: str) -> tuple[str, dict[str, str]]:
    """The URL and headers of a compaction request of ``kind``."""
    base = (settings.upstream_api_base or "").rstrip("/")
    key = settings.upstream_api_key.get_secret_value() if settings.upstream_api_key else ""
    headers = {"content-type": "application/json"}
    if kind == RESPONSES:
        if key:
            headers["authorization"] = f"Bearer {key}"
        return f"{base}/responses/compact", headers
    headers.update({"anthropic-version": ANTHROPIC_VERSION, "anthropic-beta": ANTHROPIC_BETA})
    if key:
        headers["x-api-key"] = key
    return f"{base.removesuffix('/v1')}/v1/messages", headers


def items_from(kind: str, reply: Any, model: str) -> list[dict[str, Any]]:
    """The provider items of a compaction reply; ``CompactionFailed`` for any other shape."""
    if not isinstance(reply, Mapping):
        raise CompactionFailed("the reply is not a JSON object")
    found = reply.get("output") if kind == RESPONSES else reply.get("content")
    if not isinstance(found, list) or not all(isinstance(i, Mapping) for i in found):
        raise CompactionFailed("the reply has no list of items")
    provider = providers.OPENAI if kind == RESPONSES else providers.ANTHROPIC
    if kind == MESSAGES:
        found = [block for block in found if block.get("type") == KIND]
    compactions = [i for i in found if i.get("type") == KIND]
    if not compactions or not all(_sealed(kind, i) for i in compactions):
        raise CompactionFailed("the reply holds no compaction item")
    return [
        provider_item(provider, model, item, at, kind=KIND, readable=_readable(item))
        for at, item in enumerate(found)
    ]


def _sealed(kind: str, item: Mapping[str, Any]) -> bool:
    """Whether a compaction item carries its opaque part (OpenAI's encrypted content;
    Anthropic's block its content)."""
    field = "encrypted_content" if kind == RESPONSES else "content"
    return isinstance(item.get(field), str) and bool(item.get(field))


def _readable(item: Mapping[str, Any]) -> str:
    content = item.get("content")
    return content if isinstance(content, str) and item.get("type") == KIND else ""


def compact(
    settings: Settings, kind: str, model: str, messages: Sequence[Mapping[str, Any]], seconds: float
) -> list[dict[str, Any]]:
    """Ask the provider to compact ``messages``; its items, or ``CompactionFailed``."""
    import httpx  # only where the option is on (litellm and the provider SDKs bring it)

    url, headers = endpoint(settings, kind)
    body = dumps(request(kind, model, messages)).encode()
    try:
        response = httpx.post(url, content=body, headers=headers, timeout=seconds)
    except httpx.HTTPError as exc:
        raise CompactionFailed(f"{type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        raise CompactionFailed(f"HTTP {response.status_code}: {response.text[:ERROR_CHARS]}")
    try:
        reply = response.json()
    except ValueError:
        raise CompactionFailed("the reply is not JSON") from None
    return items_from(kind, reply, model)


def attach(run: Run, snapshot: Snapshot, split: Split, row: dict[str, Any]) -> str:
    """Ask for the provider's compaction of the span ``row`` summarizes and store its items on
    ``row`` (``provider_items``); a note for the run's reason ("" when not asked). Never raises:
    a failure leaves the readable summary alone."""
    model = snapshot.model or ""
    kind = dialect(run.settings, model)
    if kind is None:
        return ""
    if kind == MESSAGES and sum(m.tokens for m in split.older) < ANTHROPIC_MIN_TRIGGER:
        return ""  # under Anthropic's smallest trigger: it would not compact
    seconds = min(run.settings.llm_timeout, run.deadline - time.monotonic())
    started = time.monotonic()
    fields = {"conversation_id": run.conversation_id, "task_id": run.task_id, "model": model}
    try:
        if seconds <= 0:
            raise CompactionFailed("no time left in the run")
        messages = span_messages(snapshot, split, model)
        items = compact(run.settings, kind, model, messages, seconds)
    except Exception as exc:  # whatever went wrong, the readable summary is written
        counts["failed"] += 1
        text = str(exc) if isinstance(exc, CompactionFailed) else f"{type(exc).__name__}: {exc}"
        error = redact(text, known_secrets(run.settings))[:ERROR_CHARS]
        run.emit(PROVIDER_COMPACTION, **fields, outcome="failed", error=error)
        return f"; provider compaction failed, the readable summary alone is kept ({error})"
    counts["ok"] += 1
    row["provider_items"] = dumps(items)
    elapsed = int((time.monotonic() - started) * 1000)
    run.emit(PROVIDER_COMPACTION, **fields, outcome="ok", items=len(items), duration_ms=elapsed)
    return f"; {providers.provider_of(model)} compacted the same span"
