"""One extraction, ``recap.extract_memories``: read, call the extractor with no session held,
write once.

1. One short read: the setting and the user's switch (either off: ``skipped``, nothing
   called), the conversation and its incarnation, the turn's leaf (given, else the head), the
   turn already done (a redelivered task: ``skipped``), the last messages of its branch and the
   user's stored entries.
2. The window (``core.memory.window``) and the extractor's call, no connection held. A
   retryable model error asks the task to run again later (``RetryLater``), as compression does.
3. One short write (``core.storage.memories.write_extraction``): the edits within the user's
   cap, the turn marked done (unique per user, conversation and turn, so exactly one extraction
   of a turn writes, however often its task is delivered) and a compaction-log row (trigger
   ``memory``), all under the conversation's lock and only for the conversation read.

A failure is logged too (action ``memory_failed``: the compression's failure streak does not
count it), then raised, so Celery and Flower record FAILURE.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from sqlalchemy import Engine

from recap.core.memory.extractor import (
    OFFLINE_MODEL,
    ExtractionFailed,
    Extractor,
    OfflineExtractor,
    RetryLater,
)
from recap.core.memory.window import window as make_window
from recap.core.redact import known_secrets, redact
from recap.core.settings import Settings
from recap.core.storage import memories, reads, store
from recap.core.storage.db import session_scope
from recap.core.values.memory import check_user

EXTRACT_TASK = "recap.extract_memories"
TRIGGER = "memory"
EXTRACTED, SKIPPED, FAILED = "memory", "memory_skipped", "memory_failed"  # log actions
READ_BACK = 8  # stored messages read per window message (tool results are skipped)
ENTRY_POINT_GROUP = "recap.engine"

Extractors = Callable[[Settings, int], Extractor]


def offline(settings: Settings, attempt: int) -> Extractor:
    """Core's own extractor: the offline rules."""
    return OfflineExtractor()


def installed_extractors() -> Extractors:
    """The extractors this installation provides (the ``recap.engine`` entry point
    ``extractors``: in the recap distribution, the memory model through litellm), else the
    offline one."""
    for entry in entry_points(group=ENTRY_POINT_GROUP, name="extractors"):
        made = entry.load()
        if callable(made):
            return made  # type: ignore[no-any-return]
    return offline


class Failed(Exception):
    """The extraction failed (logged, nothing else written); its masked reason."""


def _result(action: str, reason: str, **more: Any) -> dict[str, Any]:
    return {"action": action, "reason": reason, **more}


def extract_memories(
    engine: Engine,
    settings: Settings,
    user_id: str,
    conversation_id: str,
    leaf: int | None = None,
    *,
    extractors: Extractors = offline,
    attempt: int = 0,
    task_id: str | None = None,
) -> dict[str, Any]:
    """One extraction (see the module's text): its JSON result. Raises ``RetryLater`` for a
    retryable model error and ``Failed`` for one that is not (after logging it)."""
    user_id = check_user(user_id)
    base: dict[str, Any] = {"user_id": user_id, "conversation_id": conversation_id}
    if settings.memory != "on":
        return _result("skipped", f"RECAP_MEMORY is {settings.memory}, not on", **base)
    started = time.monotonic()
    with session_scope(engine) as session:
        connection = session.connection()
        if not memories.enabled(connection, user_id):
            return _result("skipped", "the user turned memory off", **base)
        incarnation = store.incarnation_of(connection, conversation_id)
        if incarnation is None:
            return _result("skipped", "unknown conversation: deleted, or never stored", **base)
        path = reads.branch_path(connection, conversation_id, leaf)
        if not path:
            return _result("skipped", "the conversation holds no message", **base)
        head = path[-1]
        if memories.turn_done(connection, user_id, conversation_id, head):
            return _result("skipped", "this turn's memories were extracted already", **base)
        rows = reads.Rows(connection, conversation_id)
        recent = path[-settings.memory_window_messages * READ_BACK :]
        rows.fetch(recent)
        branch = [rows.msg(mid) for mid in recent]
        existing = memories.load(connection, user_id)
    base["message_id"] = head
    view = make_window(
        branch, size=settings.memory_window_messages, max_tokens=settings.memory_window_tokens
    )
    if not view.has_user:
        return _result("skipped", "no user message in the window", **base)
    extractor = extractors(settings, attempt)
    log_row = {
        "conversation_id": conversation_id,
        "task_id": task_id,
        "trigger": TRIGGER,
        "leaf_message_id": head,
    }
    try:
        found = extractor.extract(view, existing)
    except ExtractionFailed as exc:
        reason = redact(str(exc), known_secrets(settings))
        memories.log_failure(
            engine,
            {**log_row, "action": FAILED, "reason": reason, "model": _model(settings),
             "duration_ms": _ms(started)},
        )  # fmt: skip
        raise Failed(reason) from None
    done = memories.write_extraction(
        engine,
        memories.ExtractionWrite(
            user_id=user_id,
            conversation=store.Identity(conversation_id, incarnation),
            message_id=head,
            edits=found.edits,
            cap=settings.memory_max_tokens,
            task_id=task_id,
            log={
                **log_row,
                "action": EXTRACTED,
                "reason": _reason(found.edits, found.refused),
                "model": found.model,
                "input_tokens": found.input_tokens,
                "output_tokens": found.output_tokens,
                "cost": found.cost,
                "duration_ms": _ms(started),
            },
        ),
    )
    if done.done is not None:
        return _result("skipped", done.done, **base)
    return _result(
        "extracted",
        _reason(done.applied, [*found.refused, *done.refused]),
        **base,
        applied=[{"op": e.op, "key": e.key} for e in done.applied],
        refused=[*found.refused, *done.refused],
        model=found.model,
        input_tokens=found.input_tokens,
        output_tokens=found.output_tokens,
    )


def _model(settings: Settings) -> str:
    return settings.memory_model or settings.summary_model or OFFLINE_MODEL


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def _reason(edits: Any, refused: list[str]) -> str:
    said = "; ".join(f"{e.op} {e.key}" for e in edits) or "nothing to remember"
    return f"{said}; refused: {len(refused)}" if refused else said


def extract_now(
    engine: Engine,
    settings: Settings,
    user_id: str,
    conversation_id: str,
    leaf: int | None = None,
) -> dict[str, Any]:
    """``extract_memories`` in this process with the installed extractor, retrying a
    retryable error after its delay up to ``RECAP_MAX_ATTEMPTS`` (``Recap.extract_memories``,
    the CLI). ``NotFoundError`` for an unknown leaf."""
    extractors = installed_extractors()
    attempt = 0
    while True:
        try:
            return extract_memories(
                engine, settings, user_id, conversation_id, leaf,
                extractors=extractors, attempt=attempt,
            )  # fmt: skip
        except RetryLater as exc:
            attempt += 1
            if attempt >= settings.max_attempts:
                return _result("failed", f"gave up after {attempt} attempts: {exc.reason}")
            time.sleep(min(exc.delay, settings.retry_backoff_max))
        except Failed as exc:
            return _result("failed", str(exc))
