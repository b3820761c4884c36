"""Engine-level operations for hosts and the CLI: each opens its own short session."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError, ProgrammingError

from core import assembly, outputs, reads, store, tokens
from core.compression import request_history_tokens
from core.db import session_scope
from core.errors import InputError, RecapError
from core.records import ClearingRec, Msg
from core.settings import Settings
from core.validate import parse_json_line

Prepare = Callable[[dict[str, Any]], dict[str, Any]]


class SchemaMissingError(RecapError):
    """The database has no Recap schema yet."""


def _guard_schema(exc: Exception) -> None:
    text = str(exc).lower()
    if "no such table" in text or "does not exist" in text:
        raise SchemaMissingError(
            "the database has no Recap schema; run `recap init` first"
        ) from None


def read_import_file(path: Path) -> list[dict[str, Any]]:
    """Every record of an import file (JSON lines), or an ``InputError`` naming the bad line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from None
    records = [
        parse_json_line(line, f"{path.name} line {number}")
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip()
    ]
    if not records:
        raise InputError(f"{path.name}: no conversations in the file")
    return records


def import_conversations(
    engine: Engine,
    records: Iterable[Mapping[str, Any]],
    settings: Settings,
    *,
    model: str | None = None,
    max_input_tokens: int | None = None,
    prepare: Prepare | None = None,
) -> list[tuple[str, int]]:
    """Import records in one transaction: all of them, or none."""
    try:
        with session_scope(engine) as session:
            return store.import_records(
                session,
                list(records),
                default_model=settings.default_model,
                model=model,
                max_input_tokens=max_input_tokens,
                prepare=prepare,
            )
    except (OperationalError, ProgrammingError) as exc:
        _guard_schema(exc)
        raise


def new_conversation(
    engine: Engine,
    settings: Settings,
    conversation_id: str | None = None,
    *,
    model: str | None = None,
    max_input_tokens: int | None = None,
) -> str:
    """Create an empty conversation; returns its id."""
    with session_scope(engine) as session:
        conversation = store.create_conversation(
            session, conversation_id, model or settings.default_model, max_input_tokens
        )
        return conversation.id


def add_message(
    engine: Engine,
    conversation_id: str,
    message: Mapping[str, Any],
    *,
    parent_id: int | None = None,
    prepare: Prepare | None = None,
) -> int:
    """Append one message (or branch from ``parent_id``); returns its id."""
    try:
        with session_scope(engine) as session:
            return store.add_message(session, conversation_id, message, parent_id, prepare)
    except (OperationalError, ProgrammingError) as exc:
        _guard_schema(exc)
        raise


def export_conversation(
    engine: Engine, conversation_id: str, leaf: int | None = None, *, full: bool = False
) -> dict[str, Any]:
    """The branch as stored, in the import format, each message with its ``id``; with ``full``,
    tool outputs and arguments truncated on the way in are put back while their files exist."""
    with session_scope(engine) as session:
        conversation = store.get_conversation(session, conversation_id)
        branch = store.load_branch(session, conversation_id, leaf)
        meta = dict(conversation.meta or {})
    out: dict[str, Any] = {"id": conversation_id, **meta}
    render = outputs.restore if full else Msg.to_openai
    out["messages"] = [{"id": m.id, **render(m)} for m in branch]
    return out


def list_summaries(engine: Engine, conversation_id: str) -> list[dict[str, Any]]:
    """The conversation's summaries, oldest first, as the CLI prints them."""
    with session_scope(engine) as session:
        store.get_conversation(session, conversation_id)
        summaries = store.load_summaries(session, conversation_id)
    return [
        {
            "id": s.id,
            "cutoff_message_id": s.cutoff_message_id,
            "previous_summary_id": s.previous_summary_id,
            "tokens": s.tokens,
            "model": s.model,
            "identifier_retention": round(s.identifier_retention, 4),
            "created_at": s.created_at.isoformat() if s.created_at else "",
        }
        for s in summaries
    ]


def record_usage(
    engine: Engine,
    conversation_id: str,
    *,
    prompt_tokens: int,
    completion_tokens: int = 0,
    cached_tokens: int = 0,
    leaf: int | None = None,
) -> dict[str, Any]:
    """Record the provider's usage for the request sent at ``leaf`` (default: the latest)."""
    with session_scope(engine) as session:
        state = store.load_token_index(session, conversation_id, leaf)
        estimated = _estimate(state)
        store.record_usage(
            session,
            conversation_id,
            estimated_tokens=estimated,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
            leaf_message_id=state.leaf_id,
        )
    factor = tokens.Calibration(estimated, prompt_tokens).factor
    return {"estimated": estimated, "measured": prompt_tokens, "calibration": round(factor, 4)}


def _estimate(state: store.TokenIndex) -> int:
    """What the request for this branch carries: the root system prompt (sent even when a
    summary covers it), the summary, and the messages after its cutoff."""
    history = request_history_tokens(state.branch, state.summary, state.clearings)
    return tokens.TOKENS_REPLY_PRIMING + history


def conversation_stats(
    engine: Engine, conversation_id: str, settings: Settings, leaf: int | None = None
) -> dict[str, Any]:
    """Context pressure from stored counts (and the latest provider reading), no model call."""
    with session_scope(engine) as session:
        state = store.load_token_index(session, conversation_id, leaf)
        usage = store.latest_usage(session, conversation_id)
    window = tokens.context_window(state.model, state.max_input_tokens)
    estimated = _estimate(state)
    used, basis = estimated, "estimated"
    if usage is not None and usage.leaf_message_id == state.leaf_id:
        used, basis = usage.prompt_tokens, "measured"
    elif usage is not None:
        factor = tokens.Calibration(usage.estimated_tokens, usage.prompt_tokens).factor
        used = round(estimated * factor)
    available = tokens.available_tokens(window, settings.safety_margin)
    pressure = used / available if available > 0 else float("inf")
    return {
        "window": window,
        "used": used,
        "basis": basis,
        "pressure": round(pressure, 4),
        "suggest_compress": used > settings.trigger_ratio * available,
    }


def assemble(
    engine: Engine,
    conversation_id: str,
    settings: Settings,
    *,
    leaf: int | None = None,
    system: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    reminder: str | None = None,
    context_files: Iterable[assembly.ContextFile] = (),
    model: str | None = None,
    max_input_tokens: int | None = None,
    text_only: bool = False,
    cache_breakpoints: bool = False,
) -> assembly.AssembledRequest:
    """The request the host should send now for the branch ending at ``leaf``.

    One short read session copies out what the request needs (``core.reads``); the rest is
    ``core.assembly.assemble``. The window is ``max_input_tokens`` when given, else the
    conversation's override (unless another ``model`` is named), else the model's window from
    litellm's map.
    """
    if max_input_tokens is not None and max_input_tokens <= 0:
        raise InputError(f"--max-input-tokens must be positive, got {max_input_tokens}")
    try:
        with session_scope(engine) as session:
            stored_model, stored_window = reads.conversation_head(session, conversation_id)
            target = model or stored_model
            override = stored_window if max_input_tokens is None and model is None else None
            window = tokens.context_window(target, max_input_tokens or override)
            budget = None if text_only else tokens.available_tokens(window, settings.safety_margin)
            loaded = reads.load_request_branch(session, conversation_id, leaf, budget)
    except (OperationalError, ProgrammingError) as exc:
        _guard_schema(exc)
        raise
    return assembly.assemble(
        loaded.branch,
        model=target,
        window=window,
        safety_margin=settings.safety_margin,
        summary=loaded.summary,
        clearings=loaded.clearings,
        system=system,
        tools=tools,
        reminder=reminder,
        context_files=tuple(context_files),
        text_only=text_only,
        cache_breakpoints=cache_breakpoints,
        missing_outputs=_missing_outputs(loaded.branch, loaded.clearings),
        omitted=loaded.omitted,
    )


def _missing_outputs(branch: list[Msg], clearings: Mapping[int, ClearingRec]) -> frozenset[str]:
    """Saved outputs of cleared results on the branch whose files are gone (placeholders say so)."""
    return frozenset(
        message.output_path
        for message in branch
        if message.output_path
        and message.id in clearings
        and not outputs.output_exists(message.output_path)
    )
