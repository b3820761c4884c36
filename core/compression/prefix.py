"""The chat's last request, built again for the summarizer to send its request on it.

A summarizer call built as the chat's own prefix plus an instruction (``core.summaries.onprefix``)
is read mostly from the provider's prompt cache. The worker does not see the chat's requests: it
assembles the last one again from the stored history and what that request was given beside it
(its system prompt, tools, reminder and rendering, kept as text on the request profile by
``core.service.recording``), at the leaf the profile records as sent.

The request built again is used only when it is the one sent: its key of what it is built from
(model, leaf, summary, clearings, pins, fixed parts: ``profiles.state_key``) and its token count
must equal what the profile recorded for the sent request. Otherwise, and wherever the prefix
cannot be shared, ``chat_prefix`` gives None and the summarizer keeps its own request shape:

- no summary model, or one other than the conversation's (a provider's cache is per model);
- the model's provider caches no prefixes (``core.decision.activation.cache_rules``);
- no request recorded, or recorded before its text was kept, or given context files (not kept);
- the history, summary, clearings or memory changed since in a way that changes that request.

Each message of the request is matched to its stored message (its rendering, cache marks
aside), so the span to summarize can be found in it; a message that matches none (the system
prompt, the summary, a stub) has no id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Engine

from recap.core.compression.report import log
from recap.core.counting import tokens
from recap.core.counting.providers import model_name
from recap.core.decision import activation, policy
from recap.core.request import sentspec
from recap.core.request.assembly import render_stored, stored_prompt
from recap.core.settings import Settings
from recap.core.storage import profile as profiles
from recap.core.storage import store
from recap.core.storage.db import session_scope
from recap.core.summaries.onprefix import SentRequest
from recap.core.values.records import ClearingRec, Msg


def shares_cache(summary_model: str | None, chat_model: str) -> bool:
    """Whether a summarizer call by ``summary_model`` can read the chat's cached prefix: the same
    model (its own name, whatever the provider prefix) at a provider that caches prefixes."""
    if not summary_model or model_name(summary_model) != model_name(chat_model):
        return False
    return activation.cache_rules(summary_model).read_price < 1.0


def for_summary(
    engine: Engine,
    settings: Settings,
    snapshot: policy.Snapshot,
    decision: policy.Decision,
    incarnation: str | None = None,
) -> SentRequest | None:
    """``chat_prefix`` when the run's decision is to summarize (else None, and nothing read)."""
    if decision.action != policy.SUMMARIZE:
        return None
    return chat_prefix(engine, settings, snapshot, incarnation)


def chat_prefix(
    engine: Engine,
    settings: Settings,
    snapshot: policy.Snapshot,
    incarnation: str | None = None,
) -> SentRequest | None:
    """The chat's last request as it was sent, built again, or None (the module's rules)."""
    profile = snapshot.profile
    sent = profile.sent if profile is not None else None
    if sent is None or profile is None or profile.spec_hash is None:
        return None
    if not shares_cache(settings.summary_model, snapshot.model):
        return None
    with session_scope(engine) as session:
        connection = session.connection()
        if (
            incarnation is not None
            and store.incarnation_of(connection, snapshot.conversation_id) != incarnation
        ):
            return None
        spec = sentspec.decode(profiles.load_spec(connection, snapshot.conversation_id))
    if spec is None:
        return None
    # imported here: the service's request path imports the compression run's parts
    from recap.core.service.assembling import assemble_unrecorded
    from recap.core.service.recording import request_state

    try:
        built, recording = assemble_unrecorded(
            engine, snapshot.conversation_id, settings, spec, leaf=sent.leaf_id
        )
    except Exception as exc:  # any reason it cannot be built: the summarizer's own shape
        log.info(
            "summary_prefix_unavailable",
            conversation_id=snapshot.conversation_id,
            reason=type(exc).__name__,
        )
        return None
    if recording is None:
        return None
    _, _, state = request_state(spec, recording.model, recording.loaded, built)
    if state != sent.state or built.tokens.total != sent.tokens:
        log.info(
            "summary_prefix_unavailable",
            conversation_id=snapshot.conversation_id,
            reason="the last request cannot be built again as sent",
        )
        return None
    loaded = recording.loaded
    ids = message_ids(
        built.messages,
        candidates(loaded.branch, loaded.summary.cutoff_message_id if loaded.summary else None),
        loaded.clearings,
        tokens.encoding_name_for(recording.model),
    )
    return SentRequest(
        model=recording.model,
        messages=tuple(built.messages),
        ids=ids,
        tools=tuple(dict(tool) for tool in spec.tools or ()),
        summary_id=built.summary_id,
        cache_params=tuple(built.cache_params().items()),
    )


def candidates(branch: Sequence[Msg], cutoff: int | None) -> list[Msg]:
    """The branch's messages a request sends as history: after the summary's cutoff, without
    the stored system prompt."""
    messages = list(branch)
    if stored_prompt(messages) is not None:
        messages = messages[1:]
    if cutoff is not None:
        at = next((i for i, m in enumerate(messages) if m.id == cutoff), None)
        if at is not None:
            messages = messages[at + 1 :]
    return messages


def message_ids(
    messages: Sequence[Mapping[str, Any]],
    branch: Sequence[Msg],
    clearings: Mapping[int, ClearingRec],
    encoding: str,
) -> tuple[int | None, ...]:
    """The stored id of each request message: the next stored message (in branch order) that
    renders as it does, cache marks aside; None where none does."""
    rendered = [(m.id, plain(render_stored(m, clearings, encoding))) for m in branch]
    ids: list[int | None] = []
    start = 0
    for message in messages:
        wanted = plain(message)
        found = next((k for k in range(start, len(rendered)) if rendered[k][1] == wanted), None)
        if found is None:
            ids.append(None)
            continue
        ids.append(rendered[found][0])
        start = found + 1
    return tuple(ids)


def plain(value: Any) -> Any:
    """A message without its cache marks, a content of one text part as that text."""
    if isinstance(value, Mapping):
        out = {k: plain(v) for k, v in value.items() if k != "cache_control"}
        content = out.get("content")
        if isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict):
            part = content[0]
            if part.get("type") == "text" and set(part) == {"type", "text"}:
                out["content"] = part["text"]
        return out
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value
