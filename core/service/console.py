"""The console's reads (``workers.ui``), each in its own short session: one page of the
conversations list, whether a conversation or one of its messages exists and whose it is, and
everything one conversation's page shows beside its stats (the branch as the next request would
read it, its attachments expanded, the summaries, the compaction log, the provider readings, when
messages were written and cleared, the branches and the merges). Nothing here writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from recap.core.errors import NotFoundError
from recap.core.service import attaching
from recap.core.settings import Settings
from recap.core.storage import activation, attachments, compressed, console, outputs, reads
from recap.core.storage.db import session_scope
from recap.core.storage.models import utcnow
from recap.core.storage.profile import load_profile
from recap.core.values.console import Page, PressureInputs, Reading, Run
from recap.core.values.profile import Profile
from recap.core.values.records import SummaryRec


def list_conversations(  # noqa: PLR0913 - the list's filter, sort and page, each named
    engine: Engine,
    *,
    search: str,
    owner: str | None,
    scoped: bool,
    sort: str,
    descending: bool,
    limit: int,
    offset: int,
    pressure: PressureInputs | None = None,
) -> Page:
    """One page of the conversations list (``core.storage.console.list_conversations``): those
    matching ``search``, only ``owner``'s when ``scoped``, sorted and cut in the database."""
    with session_scope(engine) as session:
        return console.list_conversations(
            session.connection(),
            search=search,
            owner=owner,
            scoped=scoped,
            sort=sort,
            descending=descending,
            limit=limit,
            offset=offset,
            pressure=pressure,
        )


def conversation_owner(engine: Engine, conversation_id: str) -> tuple[bool, str | None]:
    """Whether the conversation exists, and its owner's fingerprint."""
    with session_scope(engine) as session:
        return console.owner_of(session.connection(), conversation_id)


def has_message(engine: Engine, conversation_id: str, message_id: int) -> bool:
    """Whether ``message_id`` is one of the conversation's messages."""
    with session_scope(engine) as session:
        return console.has_message(session.connection(), conversation_id, message_id)


@dataclass(frozen=True, kw_only=True)
class ConversationRead:
    """What one conversation's page is built from, read in one session."""

    model: str
    window_override: int | None
    owner: str | None
    loaded: reads.RequestBranch
    summaries: list[SummaryRec]
    profile: Profile | None
    runs: list[Run]
    readings: list[Reading]
    created: dict[int, datetime]
    cleared_at: dict[int, datetime]
    branches: list[tuple[int, datetime | None]]
    expanded: reads.RequestBranch | None = None  # the branch with its attachments expanded
    provenance: dict[int, str] = field(default_factory=dict)  # attached items: where from
    merges: list[dict[str, Any]] = field(default_factory=list)  # the branch's merges


def read_conversation(
    engine: Engine, conversation_id: str, leaf: int | None, settings: Settings
) -> ConversationRead:
    """The branch ending at ``leaf`` (the latest when None) as the next request would read it
    (a ready summary chosen as it would choose it, used now or still waiting), and the rows the
    page shows beside it; a ``NotFoundError`` for an unknown conversation."""
    with session_scope(engine) as session:
        connection = session.connection()
        exists, owner = console.owner_of(connection, conversation_id)
        if not exists:
            raise NotFoundError(f"unknown conversation {conversation_id!r}")
        model, override = reads.conversation_head(session, conversation_id)
        profile = load_profile(connection, conversation_id)
        now = utcnow()
        context = activation.context_for(session, conversation_id, settings, model, profile, now)
        loaded = reads.load_whole_branch(session, conversation_id, leaf, context)
        expanded, expansion = attaching.expand_loaded(connection, conversation_id, loaded)
        on_branch = {m.id for m in loaded.branch}
        return ConversationRead(
            expanded=expanded,
            provenance=dict(expansion.provenance) if expansion is not None else {},
            merges=[
                m.as_dict()
                for m in attachments.merges_of(connection, conversation_id)
                if m.instruction_id in on_branch
            ],
            model=model,
            window_override=override,
            owner=owner,
            loaded=loaded,
            summaries=compressed.load_summaries(session, conversation_id),
            profile=profile,
            runs=console.runs(connection, conversation_id),
            readings=console.readings(connection, conversation_id),
            created=console.message_times(connection, conversation_id),
            cleared_at=console.clearing_times(connection, conversation_id),
            branches=console.branch_heads(connection, conversation_id),
        )


def missing_outputs(loaded: reads.RequestBranch, settings: Settings) -> frozenset[str]:
    """The saved outputs of the branch's cleared tool results whose files are gone (a request
    says so in their placeholder instead of pointing at them)."""
    return frozenset(
        m.output_path
        for m in loaded.branch
        if m.output_path
        and m.id in loaded.clearings
        and not outputs.output_exists(m.output_path, settings.output_dir)
    )
