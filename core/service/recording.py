"""What ``assemble`` records about a request it built (its profile, media aged and results
shortened, counts made anew, a ready summary's first use), written now or while the model
answers, each write in a transaction that finds the conversation still the one read."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime

from sqlalchemy import Engine

from recap.core.counting import media
from recap.core.request import assembly, sentspec
from recap.core.service.conversations import log
from recap.core.storage import compressed, reads, recount, store
from recap.core.storage import profile as profiles
from recap.core.storage.db import session_scope
from recap.core.values.records import ClearingRec, merge_step, steps_of
from recap.core.values.request import RequestSpec


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Recording:
    """What ``assemble`` records about a request it built, to write now or later: the fixed
    parts and Recap's count of the request (what ``record_usage`` compares the provider's
    reading with), media aged and results shortened (so they stay so), counts made anew, and
    one log line when history was left out.

    ``recap serve`` writes it while the upstream answers (a stream: once its first chunk is out),
    not before the request goes out;
    the conversation's turn lock, held to the stored reply, keeps its next request after it."""

    engine: Engine
    conversation_id: str
    parts: profiles.FixedParts
    profile: profiles.Profile | None
    spec: RequestSpec
    now: datetime
    model: str
    stored_model: str
    loaded: reads.RequestBranch
    built: assembly.AssembledRequest
    recounted: list[recount.Change]
    incarnation: str | None = None  # the conversation as read: nothing is written for another
    composition: tuple[float, ...] | None = None  # the request's estimate by kind of content

    def write(self) -> None:
        """Write what the request learned, each write in a transaction that holds the
        conversation's lock and finds it still the one read (else it writes nothing: the
        conversation was deleted, perhaps created again under its id)."""
        engine, built = self.engine, self.built
        conversation = store.Identity(self.conversation_id, self.incarnation)
        _record_profile(
            engine,
            conversation,
            self.parts,
            self.profile,
            self.spec,
            self.now,
            (self.model, self.loaded, built),
            composition=self.composition,
        )
        _record_media(engine, conversation, built)
        _record_activation(engine, conversation, self.loaded, self.now)
        if recount.current_bases(self.model) == recount.current_bases(self.stored_model):
            recount.record(
                engine,
                self.conversation_id,
                self.recounted,
                built.reasoning_dropped,
                incarnation=self.incarnation,
            )
        if built.truncated:
            _log_truncation(self.conversation_id, built)


def _record_profile(
    engine: Engine,
    conversation: store.Identity | str,
    parts: profiles.FixedParts,
    stored: profiles.Profile | None,
    spec: RequestSpec,
    now: datetime,
    built: tuple[str, reads.RequestBranch, assembly.AssembledRequest],
    *,
    composition: tuple[float, ...] | None = None,
) -> None:
    """Record the fixed parts this request was given and Recap's count of the request built
    (what ``record_usage`` compares the provider's reading with), unless the stored profile
    already says exactly that (a repeat of the same request writes nothing). Only a request
    that was built is recorded: a failing ``assemble`` writes nothing. ``composition`` is the
    request's estimate by kind of content (``assemble`` works it out; without it the stored
    one stays). What the request was given beside the history is kept as text
    (``core.request.sentspec``) when its hash differs from the stored one: the worker builds the
    summarizer's request on the chat's prefix from it (``core.compression.prefix``)."""
    model, loaded, request = built
    digest, leaf_id, state = request_state(spec, model, loaded, request)
    if composition is None and stored is not None and stored.sent is not None:
        composition = stored.sent.composition  # not given (``Recording`` always gives it)
    sent = profiles.Sent(request.tokens.total, leaf_id, state, composition)
    given = sentspec.encode(spec)  # kept as text only when its hash changed
    changed = given if stored is None or stored.spec_hash != given[1] else None
    if (
        stored is not None
        and stored.parts == parts
        and stored.content_hash == digest
        and stored.sent == sent
        and changed is None
    ):
        return
    if isinstance(conversation, str):
        conversation = store.Identity(conversation)
    with session_scope(engine) as session:
        if store.lock_conversation(session, conversation.id, incarnation=conversation.incarnation):
            profiles.save_parts(
                session.connection(), conversation.id, parts, digest, now, sent, changed
            )


def request_state(
    spec: RequestSpec,
    model: str,
    loaded: reads.RequestBranch,
    request: assembly.AssembledRequest,
) -> tuple[str, int | None, str]:
    """The fingerprint of the fixed parts ``spec`` gives, the request's leaf, and the key of what
    the request is built from once recorded (``profiles.state_key``): what the profile records
    as sent, and what a request built again is checked against (``core.compression.prefix``)."""
    tools = spec.tools
    tools_text = json.dumps(tools, sort_keys=True, separators=(",", ":")) if tools else ""
    files = tuple(spec.context_files)
    digest = profiles.fingerprint(spec.system, tools_text, spec.reminder, files)
    leaf_id = loaded.branch[-1].id if loaded.branch else None
    after = _after_recording(loaded.clearings, request)
    state = profiles.state_key(
        model=model,
        leaf_id=leaf_id,
        summary_id=request.summary_id,
        clearings=after.keys(),
        content_hash=digest,
        pins=[m.id for m in loaded.pinned],
        steps=steps_of(after.values()),
    )
    return digest, leaf_id, state


def _after_recording(
    clearings: Mapping[int, ClearingRec], request: assembly.AssembledRequest
) -> dict[int, ClearingRec]:
    """The clearings once what the request learned is recorded (``_record_media``,
    ``recount.record``): media aged, thinking dropped, results sent shortened."""
    from recap.core.request.shorten import SHORTENED

    after = dict(clearings)
    learned = (
        (media.RECORDED, request.media_aged),
        (assembly.REASONING_CLEARING, request.reasoning_dropped),
        (SHORTENED, request.shortened),
    )
    for reason, done in learned:
        for mid, reclaimed in done:
            after[mid] = merge_step(after.get(mid), mid, reason, reclaimed)
    return after


def _log_truncation(conversation_id: str, request: assembly.AssembledRequest) -> None:
    """One structured event per request that left history out."""
    dropped = len(request.dropped_message_ids)
    log.warning(
        "assemble_truncated conversation_id=%s dropped=%d tokens=%d",
        conversation_id,
        dropped,
        request.truncated_tokens,
        extra={
            "event": "assemble_truncated",
            "conversation_id": conversation_id,
            "dropped": dropped,
            "tokens": request.truncated_tokens,
        },
    )


def _record_activation(
    engine: Engine, conversation: store.Identity, loaded: reads.RequestBranch, now: datetime
) -> None:
    """Record a ready summary's first use (``core.storage.activation``): from now on it is in use
    whatever the next request's numbers say."""
    choice = loaded.choice
    if choice is None or choice.activated is None:
        return
    with session_scope(engine) as session:
        if store.lock_conversation(session, conversation.id, incarnation=conversation.incarnation):
            compressed.activate_summary(session.connection(), choice.activated.id, now)


def _record_media(
    engine: Engine, conversation: store.Identity, request: assembly.AssembledRequest
) -> None:
    """Record the messages whose media aged in this request as ``media`` clearings and the tool
    results it sent shortened as ``shortened`` ones (one short write, only when something
    changed anew), so they stay so whatever the next request holds."""
    if not request.media_aged and not request.shortened:
        return
    from recap.core.request.shorten import SHORTENED
    from recap.core.storage.sweep import apply_clearings
    from recap.core.values.clearing import ClearingPlan, PlannedClearing

    with session_scope(engine) as session:
        if not store.lock_conversation(
            session, conversation.id, incarnation=conversation.incarnation
        ):
            return
        for reason, done in ((media.RECORDED, request.media_aged), (SHORTENED, request.shortened)):
            items = tuple(
                PlannedClearing(message_id=mid, tokens_reclaimed=reclaimed)
                for mid, reclaimed in done
            )
            if items:
                apply_clearings(session, conversation.id, ClearingPlan(reason, items))
