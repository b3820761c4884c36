"""Conversations as a whole: import, new, add, export, meta, summaries, usage readings, the
output reserve and stats; each operation opens its own short session."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError, ProgrammingError

from recap.core import inputs
from recap.core.counting import calibration, tokens
from recap.core.decision import policy
from recap.core.errors import InputError, SchemaMissingError
from recap.core.request.native_items import described
from recap.core.request.validate import parse_json_line
from recap.core.results import ExportedConversation, Stats, SummaryInfo, UsageRecorded
from recap.core.settings import Settings, get_settings
from recap.core.storage import compressed, outputs, reads, store, usage
from recap.core.storage import profile as profiles
from recap.core.storage import snapshot as snapshots
from recap.core.storage.db import is_schema_missing, session_scope, write_scope
from recap.core.storage.models import utcnow
from recap.core.values.records import Msg, steps_of

Prepare = store.Preparer  # the ingest step (core.storage.outputs.Ingest)
log = logging.getLogger("recap.assemble")


def guard_schema(exc: Exception) -> None:
    if is_schema_missing(exc):
        raise SchemaMissingError(
            "the database has no Recap schema; run `recap init` first"
        ) from None


@contextmanager
def _undone_on_error(prepare: Prepare | None) -> Iterator[Prepare | None]:
    """The ingest step for one unit of work: if the unit fails, the output files it wrote are
    deleted again (files that were there before are kept), so a refused import leaves none."""
    if not isinstance(prepare, outputs.Ingest):
        yield prepare
        return
    journal = outputs.WriteJournal()
    try:
        yield prepare.journaled(journal)
    except BaseException:
        journal.undo()
        raise


def read_import_file(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    """Every record of an import file (JSON lines), or an ``InputError`` naming the bad line;
    a file over ``limit`` bytes (default ``RECAP_MAX_INPUT_BYTES``) is refused unread."""
    text = inputs.read_text(path, get_settings().max_input_bytes if limit is None else limit)
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
        with _undone_on_error(prepare) as ingest, session_scope(engine) as session:
            return store.import_records(
                session,
                list(records),
                default_model=settings.default_model,
                model=model,
                max_input_tokens=max_input_tokens,
                prepare=ingest,
            )
    except (OperationalError, ProgrammingError) as exc:
        guard_schema(exc)
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
    """Append one message after the branch head (or branch from ``parent_id``), in a short
    transaction under the conversation's append lock; returns its id."""
    return add_many(engine, conversation_id, [message], parent_id=parent_id, prepare=prepare)[0]


def add_many(
    engine: Engine,
    conversation_id: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    parent_id: int | None = None,
    prepare: Prepare | None = None,
) -> list[int]:
    """Append one turn's messages as a chain, in one transaction under the conversation's append
    lock: all of them or none, tool results paired across the batch; returns their ids."""
    if not messages:
        raise InputError("add_many needs at least one message")
    try:
        with _undone_on_error(prepare) as ingest, session_scope(engine) as session:
            ids = store.append_messages(session, conversation_id, messages, parent_id, ingest)
            if messages[0].get("role") == "assistant":  # perhaps the reply committing a merge
                from recap.core.service.attaching import commit_on_add

                commit_on_add(session.connection(), conversation_id, ids)
            return ids
    except (OperationalError, ProgrammingError) as exc:
        guard_schema(exc)
        raise


def export_conversation(
    engine: Engine,
    conversation_id: str,
    leaf: int | None = None,
    *,
    full: bool = False,
    output_dir: Path | None = None,
) -> ExportedConversation:
    """The branch as stored, in the import format, each message with its ``id``; with ``full``,
    tool outputs and arguments truncated on the way in are put back while their files exist
    (only files Recap saved under ``output_dir``, default ``RECAP_OUTPUT_DIR``)."""
    with session_scope(engine) as session:
        conversation = store.get_conversation(session, conversation_id)
        branch = reads.load_whole_branch(session, conversation_id, leaf).branch
        meta = dict(conversation.meta or {})
    root = output_dir or get_settings().output_dir

    def render(message: Msg) -> dict[str, Any]:
        return outputs.restore(message, root) if full else message.to_openai()

    messages = [{"id": m.id, **outputs.export_parts(render(m), root, full=full)} for m in branch]
    return ExportedConversation(id=conversation_id, messages=messages, meta=meta)


RESERVED_META_KEYS = ("id", "messages")  # export prints meta beside these


def conversation_meta(engine: Engine, conversation_id: str) -> dict[str, Any]:
    """What a host keeps beside the conversation (``meta``), without reading its messages."""
    with session_scope(engine) as session:
        return dict(store.get_conversation(session, conversation_id).meta or {})


def set_conversation_meta(
    engine: Engine, conversation_id: str, key: str, value: Any
) -> dict[str, Any]:
    """Set one key of the conversation's ``meta`` (None removes it); the meta it leaves. A
    JSON value of the host's, never read by Recap's decisions."""
    if key in RESERVED_META_KEYS or not key:
        raise InputError(f"meta key {key!r} is reserved (the export format uses it)")
    json.dumps(value)  # a value that cannot be stored is refused before the write
    with session_scope(engine) as session:
        conversation = store.get_conversation(session, conversation_id)
        meta = dict(conversation.meta or {})
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
        conversation.meta = meta or None
        session.add(conversation)
    return meta


def list_summaries(engine: Engine, conversation_id: str) -> list[SummaryInfo]:
    """The conversation's summaries, oldest first, as the CLI prints them."""
    with session_scope(engine) as session:
        store.get_conversation(session, conversation_id)
        summaries = compressed.load_summaries(session, conversation_id)
    return [
        SummaryInfo(
            id=s.id,
            cutoff_message_id=s.cutoff_message_id,
            previous_summary_id=s.previous_summary_id,
            tokens=s.tokens,
            model=s.model,
            identifier_retention=round(s.identifier_retention, 4),
            created_at=s.created_at.isoformat() if s.created_at else "",
            provider_compaction=described(s.provider_items),
        )
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
    default_fixed: int = 0,
    cache_write_tokens: int = 0,
) -> UsageRecorded:
    """Record the provider's usage for the request sent at ``leaf`` (default: the one last
    assembled), beside Recap's count of that very request as ``assemble`` built it (a truncated
    request is compared with what was sent, not with the stored history): the calibration factor
    the budget applies from then on. Only when no request of that leaf was assembled through
    Recap is the reading compared with the estimate of the stored history and the fixed parts
    the host last sent (else ``default_fixed``)."""
    now = utcnow()
    with write_scope(engine) as session:
        profile = profiles.load_profile(session.connection(), conversation_id)
        sent = profile.sent if profile is not None else None
        composition = None
        if sent is not None and (leaf is None or leaf == sent.leaf_id):
            estimated, leaf_id, state = sent.tokens, sent.leaf_id, sent.state
            composition = sent.composition
        else:  # no request of this leaf was assembled here: the stored history's estimate
            snapshot = snapshots.read_snapshot(session, conversation_id, leaf, now=now)
            fixed = policy.fixed_tokens(snapshot, policy.Knobs(default_fixed_tokens=default_fixed))
            estimated, leaf_id, state = fixed + policy.history_estimate(snapshot), leaf, None
            leaf_id = snapshot.leaf_id
        usage.record_usage(
            session,
            conversation_id,
            estimated_tokens=estimated,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
            leaf_message_id=leaf_id,
            cache_write_tokens=cache_write_tokens,
            composition=composition,
        )
        fitted = calibration.fit(usage.recent_samples(session, conversation_id))
        profiles.save_reading(
            session.connection(),
            conversation_id,
            estimated=estimated,
            measured=prompt_tokens,
            leaf_id=leaf_id,
            now=now,
            state=state,
            fitted=fitted,
        )
    factor = tokens.Calibration(estimated, prompt_tokens).factor
    return UsageRecorded(estimated=estimated, measured=prompt_tokens, calibration=round(factor, 4))


def set_output_reserve(engine: Engine, conversation_id: str, output_tokens: int | None) -> None:
    """Keep ``output_tokens`` free for the reply in this conversation's requests (0: none), or
    with None go back to the rule of ``core.counting.budget.output_reserve``."""
    if output_tokens is not None and output_tokens < 0:
        raise InputError(f"the output reserve must not be negative, got {output_tokens}")
    with write_scope(engine) as session:
        store.get_conversation(session, conversation_id)
        profiles.save_reserve(session.connection(), conversation_id, output_tokens)


def conversation_stats(
    engine: Engine, conversation_id: str, settings: Settings, leaf: int | None = None
) -> Stats:
    """Context pressure as the compression decision sees it (``core.decision.policy``), no model
    call.

    ``used`` is the whole request in provider tokens: the provider's reading while the request it
    measured is what would be sent now (``basis`` "measured"), else Recap's estimate scaled by the
    calibration factor (``basis`` "estimated"; see ``_used_now``). ``pressure`` is the history
    over the room the budget leaves it (``available``); ``suggest_compress`` is the decision's
    own answer.
    """
    knobs = policy.Knobs.from_settings(settings)
    with session_scope(engine) as session:
        snapshot = snapshots.read_snapshot(
            session, conversation_id, leaf, failures=settings.failure_streak
        )
        recorded, cached, written = usage.cache_totals(session, conversation_id)
        summarizer, summarizer_cached = usage.summarizer_totals(session, conversation_id)
    decision = policy.decide(snapshot, knobs)
    p = decision.pressure
    plan = p.budget
    estimated = plan.fixed + p.history_estimate
    used, basis = _used_now(snapshot, estimated, plan.calibration)
    return Stats(
        window=plan.window,
        used=used,
        basis=basis,
        pressure=round(p.ratio, 4),
        suggest_compress=decision.action != policy.SKIP,
        estimated=estimated,
        calibration=round(plan.calibration, 4),
        fixed=plan.fixed,
        history=p.history,
        output_reserve=plan.output_reserve,
        available=p.available,
        trigger=p.trigger,
        decision=decision.action,
        reason=decision.reason,
        summary_tokens=snapshot.summary.tokens if snapshot.summary else 0,
        summary_cap=settings.summary_max_output_tokens,
        summary_waiting=snapshot.summary is not None and snapshot.summary.pending,
        recorded_input_tokens=recorded,
        cached_tokens=cached,
        cache_write_tokens=written,
        cache_hit_rate=round(min(cached / recorded, 1.0), 4) if recorded > 0 else None,
        summarizer_input_tokens=summarizer,
        summarizer_cached_tokens=summarizer_cached,
        summarizer_cache_share=(
            round(min(summarizer_cached / summarizer, 1.0), 4) if summarizer > 0 else None
        ),
    )


def _used_now(snapshot: policy.Snapshot, estimated: int, calibration: float) -> tuple[int, str]:
    """The whole request in provider tokens, and whether that is the provider's own reading.

    A reading counts as "measured" only while the request it measured is what would be sent now
    (the same model, leaf, summary, clearings, pins and fixed parts: ``profiles.state_key``);
    then it is an estimate scaled by the calibration, of the request last assembled when that
    one is still current, else of the stored history and the fixed parts."""
    profile = snapshot.profile
    if profile is None:
        return math.ceil(estimated * calibration), "estimated"
    key = profiles.state_key(
        model=snapshot.model,
        leaf_id=snapshot.leaf_id,
        summary_id=snapshot.summary.id if snapshot.summary is not None else None,
        clearings=snapshot.clearings.keys(),
        content_hash=profile.content_hash,
        pins=snapshot.pinned_ids,
        steps=steps_of(snapshot.clearings.values()),
    )
    reading, sent = profile.reading, profile.sent
    if reading is not None and (
        reading.state == key
        or (reading.state is None and reading.leaf_id == snapshot.leaf_id)  # no assemble seen
    ):
        return reading.measured, "measured"
    if sent is not None and sent.state == key:
        return math.ceil(sent.tokens * calibration), "estimated"
    return math.ceil(estimated * calibration), "estimated"
