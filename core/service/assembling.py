"""The request path: a conversation's branch read within the budget's reach, assembled, and
what the request records (its profile, media aged, counts made anew) written now or handed back
to write while the model answers."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Unpack

from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError, ProgrammingError

from recap.core.counting import budget as budgets
from recap.core.counting import kinds, media, tokens
from recap.core.request import assembly
from recap.core.request import memory as memory_rules
from recap.core.service import attaching
from recap.core.service.conversations import guard_schema
from recap.core.service.recording import Recording
from recap.core.settings import Settings
from recap.core.storage import (
    activation,
    outputs,
    reads,
    recount,
    spans,
    store,
    versions,
)
from recap.core.storage import memories as memory_store
from recap.core.storage import profile as profiles
from recap.core.storage import reuse as reuses
from recap.core.storage.db import session_scope
from recap.core.storage.models import utcnow
from recap.core.storage.reuse import BranchReuse
from recap.core.values.assembly import prompt_cache_key
from recap.core.values.attach import Expansion
from recap.core.values.memory import MemoryRec
from recap.core.values.records import ClearingRec, Msg
from recap.core.values.request import RequestParts, RequestSpec, request_from

REPLANS = 2  # requests built again when one turns out over its budget at its own mix's factor
REPLAN_STEP = 0.01  # each such build plans with a factor at least this much higher


def assemble(
    engine: Engine,
    conversation_id: str,
    settings: Settings,
    request: RequestSpec | None = None,
    *,
    leaf: int | None = None,
    record: bool = True,
    reserve_tokens: int = 0,
    reuse: BranchReuse | None = None,
    **parts: Unpack[RequestParts],
) -> assembly.AssembledRequest:
    """The request the host should send now for the branch ending at ``leaf``: the one
    ``request`` asks for, or (as ``Recap.assemble`` allows) the one its keyword ``parts`` build
    (``core.values.request.request_from``; both at once is an ``InputError``).

    One short read session copies out what the request needs (``core.storage.reads``); the rest is
    ``core.request.assembly.assemble``. The window is ``max_input_tokens`` when given, else the
    conversation's override (unless another ``model`` is named), else the model's window from
    litellm's map.

    ``as_of`` builds the request as it would have been then: the branch head at that time
    (unless ``leaf`` is given), and only the summaries and clearings recorded by then. Such a
    request, and any with ``record=False``, writes nothing (no profile, ageing or recount).
    ``reserve_tokens`` keeps that much more of the budget free (the timeline's stand-in for the
    host parts it was not given). The files and media of a summarized span are listed in
    ``forgotten_files`` after any context file left out (``core.storage.spans.span_forgotten``).

    With ``reuse``, the read starts from the conversation's last one when the database says
    nothing changed since but messages appended (``core.storage.reuse``; not for ``as_of``):
    the request is the same as a fresh read gives.
    """
    built, recording = assemble_unrecorded(
        engine,
        conversation_id,
        settings,
        request_from(request, **parts),
        leaf=leaf,
        reserve_tokens=reserve_tokens,
        reuse=reuse,
    )
    if record and recording is not None:
        recording.write()
    return built


def assemble_unrecorded(
    engine: Engine,
    conversation_id: str,
    settings: Settings,
    spec: RequestSpec,
    *,
    leaf: int | None = None,
    reserve_tokens: int = 0,
    reuse: BranchReuse | None = None,
) -> tuple[assembly.AssembledRequest, Recording | None]:
    """``assemble`` without its writes: the request, and the ``Recording`` to write for it
    (None for a request ``as_of`` a past time, which writes nothing)."""
    now = utcnow()
    at_least = None
    for _ in range(REPLANS + 1):
        read = _read_for_request(
            engine,
            conversation_id,
            settings,
            spec,
            leaf,
            reserve_tokens=reserve_tokens,
            reuse=reuse,
            now=now,
            at_least=at_least,
        )
        target, loaded = read.target, read.loaded
        built = _assembled(loaded, settings, spec, target, read.memories)
        expansion = read.expansion
        if built.fitted_tail and loaded.omitted:  # rows left unread may fit beside a cut tail
            with session_scope(engine) as session:
                again = _same_choice(session, conversation_id, settings, read, now)
                loaded = reads.load_request_branch(
                    session, conversation_id, read.leaf, None, spec.as_of, again
                )
                loaded, read.recounted = recount.refreshed(loaded, target.model)
                loaded, expansion = attaching.expand_loaded(
                    session.connection(), conversation_id, loaded
                )
            built = _assembled(loaded, settings, spec, target, read.memories)
        composition, factor = _own_factor(read, spec, built, now)
        limit = target.budget
        if limit is None or built.tokens.total * factor <= limit * read.calibration:
            break  # within the budget at the request's own factor
        at_least = max(factor, read.calibration * (1 + REPLAN_STEP))
    system, tools, reminder, files = assembly.fixed_part_tokens(
        loaded.branch, spec, model=target.model
    )
    # the user's memory is recorded with the system prompt: the trigger, reconcile and stats
    # plan with the fixed parts the request really had (core.counting.budget)
    request_parts = profiles.FixedParts(system + built.tokens.memory, tools, reminder, files)
    factor = max(factor, read.calibration)
    built = dataclasses.replace(
        built,
        max_output_tokens=_reply_room(target.model, target.window, built, factor),
        truncated_tokens=built.truncated_tokens + loaded.omitted_tokens,
        forgotten_files=[*built.forgotten_files, *read.forgotten],
        prompt_cache_key=prompt_cache_key(conversation_id, loaded.root),
        prompt_cache_retention=settings.prompt_cache_retention,
    )
    if expansion is not None:
        built = dataclasses.replace(
            built, attachments=expansion.blocks, provenance=expansion.provenance
        )
    if spec.as_of is not None:
        return built, None
    recording = Recording(
        engine=engine,
        conversation_id=conversation_id,
        parts=request_parts,
        profile=read.profile,
        spec=spec,
        now=now,
        model=target.model,
        stored_model=read.stored_model,
        loaded=loaded,
        built=built,
        recounted=read.recounted,
        incarnation=read.incarnation,
        composition=composition,
    )
    return built, recording


def _own_factor(
    read: _Read, spec: RequestSpec, built: assembly.AssembledRequest, now: datetime
) -> tuple[tuple[float, ...], float]:
    """The request's estimate split by kind of content (``core.counting.kinds``), and the
    factor its own mix is planned with (the single factor when no rates per kind are fitted)."""
    composition = tuple(
        round(value, 1)
        for value in kinds.composition(built.messages, spec.tools, built.tokens.total)
    )
    reading = read.profile.reading if read.profile is not None else None
    factor = budgets.calibration_factor(
        reading, leaf_id=read.head, now=now, composition=composition
    )
    return composition, min(max(factor, tokens.CALIBRATION_MIN), tokens.CALIBRATION_MAX)


@dataclasses.dataclass(slots=True, kw_only=True)
class _Read:
    """What ``assemble``'s read session copied out: the model and limits the request is built
    for, the branch as read, and what recording it needs."""

    target: assembly.Target
    loaded: reads.RequestBranch
    leaf: int | None  # the leaf read: the given one, or the head at ``as_of``
    recounted: list[recount.Change]  # counts made anew, to record (core.storage.recount)
    forgotten: list[str]
    profile: profiles.Profile | None
    stored_model: str
    calibration: float
    incarnation: str | None = None  # the conversation read (``store.Identity``)
    expansion: Expansion | None = None  # its attachments expanded (``core.request.attach``)
    memories: tuple[MemoryRec, ...] = ()  # the user's entries sent (within the cap)
    head: int | None = None  # the last message read


def _read_for_request(  # noqa: PLR0913 - the request and how it is planned, each named
    engine: Engine,
    conversation_id: str,
    settings: Settings,
    spec: RequestSpec,
    leaf: int | None,
    *,
    reserve_tokens: int,
    reuse: BranchReuse | None,
    now: datetime,
    at_least: float | None = None,
) -> _Read:
    """One short read session: the conversation's model and window, the request profile, and
    the branch within the budget (from the last read with ``reuse``, not for ``as_of``, whose
    branch ends at the head of that moment unless ``leaf`` is given)."""
    try:
        with session_scope(engine) as session:
            reused = reuse if spec.as_of is None else None
            stored_model, stored_window, first = _head(session, conversation_id, reused)
            model = spec.model or stored_model
            override = (
                stored_window if spec.max_input_tokens is None and spec.model is None else None
            )
            given = spec.max_input_tokens or override
            window = tokens.context_window(model, given)
            if first is not None:  # read with the version
                profile = first.profile
            else:
                profile = profiles.load_profile(session.connection(), conversation_id)
            if spec.as_of is not None and leaf is None:
                leaf = reads.leaf_at(session, conversation_id, spec.as_of)

            def budget_at(leaf_id: int | None) -> budgets.Budget:
                return request_budget(
                    settings, model, window, given is not None, profile, leaf_id, now, at_least
                )

            def limit_at(leaf_id: int | None) -> int:
                return budget_at(leaf_id).request - max(reserve_tokens, 0)

            budget = None if spec.text_only else limit_at
            moment = now if spec.as_of is None else spec.as_of
            activating = activation.context_for(
                session, conversation_id, settings, model, profile, moment, as_of=spec.as_of
            )
            if reused is not None and first is not None:
                loaded = reuses.load_request_branch(
                    session, conversation_id, leaf, budget, first.version, reused, activating
                )
            else:
                loaded = reads.load_request_branch(
                    session, conversation_id, leaf, budget, spec.as_of, activating
                )
            head = loaded.branch[-1].id if loaded.branch else leaf
            plan, limit = budget_at(head), limit_at(head)
            loaded, recounted = recount.refreshed(loaded, model)
            if first is None or first.attached:  # no attachment: nothing to expand
                loaded, expansion = attaching.expand_loaded(
                    session.connection(), conversation_id, loaded
                )
            else:
                expansion = None
            forgotten = _span_forgotten(session, conversation_id, loaded, leaf, settings)
            if first is not None:
                incarnation = first.incarnation
            else:
                incarnation = store.incarnation_of(session.connection(), conversation_id)
            remembered = _memories(session.connection(), spec.user_id, settings)
    except (OperationalError, ProgrammingError) as exc:
        guard_schema(exc)
        raise
    target = assembly.Target(
        model=model,
        window=window,
        safety_margin=settings.safety_margin,
        budget=limit,
        media_policy=media_policy(settings),
        thinking_turns=settings.thinking_turns,
    )
    return _Read(
        target=target,
        loaded=loaded,
        leaf=leaf,
        recounted=recounted,
        forgotten=forgotten,
        profile=profile,
        stored_model=stored_model,
        calibration=plan.calibration,
        incarnation=incarnation,
        expansion=expansion,
        memories=remembered,
        head=head,
    )


def _same_choice(
    session: Any, conversation_id: str, settings: Settings, read: _Read, now: datetime
) -> activation.Context | None:
    """A read again of the branch chooses the summary its first read chose: a ready summary it
    used is used again (horizon 0: at once), one it left waiting waits (no context)."""
    first = read.loaded.choice
    if first is None or first.activated is None:
        return None
    found = activation.context_for(
        session, conversation_id, settings, read.target.model, read.profile, now
    )
    return dataclasses.replace(found, horizon=0) if found is not None else None


def _memories(connection: Any, user_id: str | None, settings: Settings) -> tuple[MemoryRec, ...]:
    """The user's memory entries the request sends (``core.request.memory.chosen``): none
    without a user, with memory off, or when the user turned theirs off."""
    if user_id is None or settings.memory == "off" or settings.memory_max_tokens == 0:
        return ()
    stored = memory_store.for_request(connection, user_id)
    return tuple(memory_rules.within(stored, settings.memory_max_tokens))


def _reply_room(
    model: str, window: int, request: assembly.AssembledRequest, calibration: float
) -> int:
    """The tokens the reply may take: the window less the request in provider tokens (the
    calibrated count), capped by the model's maximum output when litellm's map knows it."""
    room = max(window - math.ceil(request.tokens.total * calibration), 0)
    most = (tokens.model_info(model) or {}).get("max_output_tokens")
    if isinstance(most, int | float) and most > 0:
        room = min(room, int(most))
    return room


def _head(
    session: Any, conversation_id: str, reuse: BranchReuse | None
) -> tuple[str, int | None, versions.RequestHead | None]:
    """The conversation's model and window override; with ``reuse``, read in one query with
    its request version (which the reused read is checked against), its incarnation, whether
    it has attachments and its profile (``core.storage.versions.request_head``)."""
    if reuse is None:
        model, window = reads.conversation_head(session, conversation_id)
        return model, window, None
    head = versions.request_head(session.connection(), conversation_id)
    return head.version.model, head.version.max_input_tokens, head


def _span_forgotten(
    session: Any,
    conversation_id: str,
    loaded: reads.RequestBranch,
    leaf: int | None,
    settings: Settings,
) -> list[str]:
    """The files and media of the span the applicable summary covers, for ``forgotten_files``
    (``core.storage.spans.span_forgotten``); none without a summary."""
    if loaded.summary is None:
        return []
    return spans.span_forgotten(session, conversation_id, loaded.summary, leaf, settings.output_dir)


def _assembled(
    loaded: reads.RequestBranch,
    settings: Settings,
    spec: RequestSpec,
    target: assembly.Target,
    memories: tuple[MemoryRec, ...] = (),
) -> assembly.AssembledRequest:
    """``core.request.assembly.assemble`` over the branch as read."""
    missing = _missing_outputs(loaded.branch, loaded.clearings, settings.output_dir)
    stored = assembly.StoredBranch(
        branch=loaded.branch,
        summary=loaded.summary,
        clearings=loaded.clearings,
        pinned=loaded.pinned,
        omitted=loaded.omitted,
        missing_outputs=missing,
        memories=memories,
    )
    return assembly.assemble(stored, spec, target=target)


def request_budget(
    settings: Settings,
    model: str,
    window: int,
    window_given: bool,
    profile: profiles.Profile | None,
    leaf: int | None,
    now: datetime,
    at_least: float | None = None,
) -> budgets.Budget:
    """The whole request's budget (``.request``: its limit in estimated tokens):
    ``core.counting.budget`` with the output reserve and the calibration factor of the latest
    provider reading, weighted by how far the branch moved past it: with rates per kind of
    content fitted, the factor of the last request's mix (the next one is mostly the same), or
    ``at_least`` when the request built with it turned out to need more."""
    reserve = budgets.output_reserve(
        tokens.model_info(model),
        window_given=window_given,
        setting=settings.reserve_output_tokens,
        override=profile.reserve_override if profile is not None else None,
    )
    reading = profile.reading if profile is not None else None
    sent = profile.sent if profile is not None else None
    factor = budgets.calibration_factor(
        reading, leaf_id=leaf, now=now, composition=sent.composition if sent else None
    )
    return budgets.request_budget(
        window,
        safety_margin=settings.safety_margin,
        output_reserve=reserve,
        calibration=max(factor, at_least or 0.0),
    )


def _missing_outputs(
    branch: list[Msg], clearings: Mapping[int, ClearingRec], root: Path
) -> frozenset[str]:
    """Saved outputs of cleared results on the branch whose files are gone (placeholders say so);
    a path Recap did not build under ``root`` counts as gone, whatever is there."""
    return frozenset(
        message.output_path
        for message in branch
        if message.output_path
        and message.id in clearings
        and not outputs.output_exists(message.output_path, root)
    )


def media_policy(settings: Settings) -> media.MediaPolicy:
    """What of a request's media is sent in full, from the settings; stored media is read back
    from the output folder."""
    return media.MediaPolicy(
        keep_turns=settings.keep_media,
        max_parts=settings.max_media_parts,
        max_tokens=settings.max_media_tokens,
        max_request_bytes=settings.max_request_bytes,
        load=outputs.media_loader(settings.output_dir),
    )


def merge(
    engine: Engine,
    conversation_id: str,
    settings: Settings,
    spec: RequestSpec,
    *,
    peers: list[attaching.Peer],
    instruction: str,
    leaf: int | None = None,
    reuse: BranchReuse | None = None,
) -> attaching.MergeStarted:
    """Open a merge of ``peers`` into the branch ending at ``leaf`` (``attaching.open_merge``)
    and assemble the request to send for it: the peers' blocks, then the instruction."""
    started = attaching.open_merge(
        engine, conversation_id, peers=peers, instruction=instruction, leaf=leaf
    )
    request = assemble(
        engine, conversation_id, settings, spec, leaf=started.instruction_id, reuse=reuse
    )
    return dataclasses.replace(started, request=request)
