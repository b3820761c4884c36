"""Stage 1, media: aged parts as placeholders, every message with media counted anew; the
messages whose media all aged now, with the tokens that saves (``media_aged``, to record)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from recap.core.counting import media, tokens
from recap.core.request.assembly.given import Given
from recap.core.request.assembly.parts import after_cutoff
from recap.core.values.draft import Draft, Records
from recap.core.values.records import ClearingRec, Msg


def stage(given: Given, draft: Draft) -> Draft:
    """The branch (and its root prompt) with media aged; the new ageings to record."""
    branch, root, aged = age_media(draft.branch, draft.root, draft.cleared, given)
    if branch is draft.branch:  # no media on the branch: nothing to change
        return draft
    return replace(draft, branch=branch, root=root, media_aged=aged)


def age_media(
    branch: Sequence[Msg],
    root: Msg | None,
    cleared: Mapping[int, ClearingRec],
    given: Given,
) -> tuple[Sequence[Msg], Msg | None, Records]:
    """The branch with aged media parts as placeholders and every message with media counted
    anew for ``model``; the root prompt's media ages once a summary covers it. Also the
    messages whose media all aged now, not recorded yet, with the tokens that saves. A pinned
    message's media never ages; the current user message's media is kept whenever it fits
    the request's budget (``media.plan_ageing``)."""
    if not any(m.content_parts and media.has_media(m.content_parts) for m in branch):
        return branch, root, ()
    summary, model, pins = given.stored.summary, given.target.model, given.pins
    after = after_cutoff(branch[1:] if root is not None else branch, summary, root)
    recorded = {mid for mid, c in cleared.items() if c.reason == media.RECORDED}
    considered = [root, *after] if root is not None else list(after)
    plan = media.plan_ageing(
        considered,
        policy=given.policy,
        model=model,
        recorded=recorded,
        text_only=given.request.text_only,
        room=given.budget,
    )
    aged = dict(plan.aged)
    if root is not None and summary is not None:
        aged[root.id] = frozenset(media.media_positions(root.content_parts))
    encoding = tokens.encoding_name_for(model)
    out: list[Msg] = []
    new_records: list[tuple[int, int]] = []
    for message in branch:
        positions = media.media_positions(message.content_parts)
        clearing = cleared.get(message.id)
        if not positions or (
            clearing is not None
            and clearing.reason != media.RECORDED
            and not clearing.arguments_only  # shortened arguments leave the content as stored
        ):
            out.append(message)
            continue
        ageing = () if message.id in pins else aged.get(message.id, ())
        parts = media.age_parts(message.content_parts or (), ageing)
        changed = message._replace(content_parts=parts)
        changed = changed._replace(
            tokens=tokens.count_message(changed.to_openai(), encoding, model=model)
        )
        out.append(changed)
        whole = set(ageing) == set(positions)
        if (
            whole
            and message is not root
            and message.role != "tool"
            and message.id not in recorded
            and plan.reasons.get(message.id) in (media.TURNS, media.CAP)
        ):
            new_records.append((message.id, max(message.tokens - changed.tokens, 0)))
    new_root = out[0] if root is not None else None
    return out, new_root, tuple(new_records)
