"""The request profile: what the host sends beside the stored history, per conversation.

``assemble`` records the token cost of the fixed parts it was given (system prompt, tool schemas,
reminder, context files: counts and a hash) and, for the worker to build the summarizer's request
on the chat's prefix, the text of the system prompt, tools and reminder (``sent_spec``, written
only when its hash changes, erased with the conversation); ``record_usage`` the provider's
reading that calibrates Recap's estimate, and ``set_output_reserve`` a conversation's own output
reserve. The compression decision, ``stats`` and reconcile plan with it (``core.counting.budget``).

The request path reads the stored hash with the branch (one primary-key read in the same
session) and writes only when the fixed parts changed, so a host that sends the same tools every
turn pays one small read per request and no write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, select
from sqlalchemy.dialects import postgresql, sqlite

from recap.core.counting import calibration
from recap.core.counting import kinds as kinds_of
from recap.core.storage.models import REQUEST_PROFILES
from recap.core.storage.store import as_utc
from recap.core.values.profile import HASH_BYTES as HASH_BYTES
from recap.core.values.profile import FixedParts as FixedParts
from recap.core.values.profile import Profile as Profile
from recap.core.values.profile import Reading as Reading
from recap.core.values.profile import Sent as Sent
from recap.core.values.profile import fingerprint as fingerprint
from recap.core.values.profile import state_key as state_key

EMPTY_PARTS = {"system_tokens": 0, "tools_tokens": 0, "reminder_tokens": 0, "context_tokens": 0}

P = REQUEST_PROFILES.c
COLUMNS = (  # what ``profile_of`` reads a profile from, in this order
    P.system_tokens,
    P.tools_tokens,
    P.reminder_tokens,
    P.context_tokens,
    P.content_hash,
    P.assembled_at,
    P.reserve_output_tokens,
    P.usage_estimated_tokens,
    P.usage_prompt_tokens,
    P.usage_leaf_message_id,
    P.usage_at,
    P.usage_state,
    P.sent_tokens,
    P.sent_leaf_message_id,
    P.sent_state,
    P.usage_kinds,
    P.sent_kinds,
    P.sent_spec_hash,
)
_ROW = select(*COLUMNS).where(P.conversation_id == bindparam("conversation_id"))


def load_profile(connection: Connection, conversation_id: str) -> Profile | None:
    """The conversation's profile, or None when nothing was recorded yet."""
    row = connection.execute(_ROW, {"conversation_id": conversation_id}).first()
    return profile_of(row) if row is not None else None


def profile_of(row: Sequence[Any]) -> Profile:
    """A stored profile from its ``COLUMNS`` (read alone, or with the request's version:
    ``core.storage.versions.request_head``)."""
    parts = None
    if row[5] is not None:
        parts = FixedParts(int(row[0]), int(row[1]), int(row[2]), int(row[3]))
    reading = None
    if row[7] is not None and row[8] is not None:
        fitted = calibration.KindFactors.decode(row[15])
        kinds = fitted.values() if fitted is not None else None
        reading = Reading(
            estimated=int(row[7]),
            measured=int(row[8]),
            leaf_id=row[9],
            at=as_utc(row[10]),
            state=row[11],
            kinds=kinds,
        )
    sent = None
    if row[12] is not None:
        sent = Sent(int(row[12]), row[13], row[14], kinds_of.decode(row[16]))
    return Profile(
        parts=parts,
        content_hash=row[4],
        reserve_override=row[6],
        reading=reading,
        sent=sent,
        assembled_at=as_utc(row[5]),
        spec_hash=row[17],
    )


def load_spec(connection: Connection, conversation_id: str) -> str | None:
    """What the last request was given beside the history, as the JSON ``save_parts`` stored
    (None: nothing stored, or stored before it was kept)."""
    statement = select(P.sent_spec).where(P.conversation_id == conversation_id)
    found = connection.execute(statement).scalar_one_or_none()
    return str(found) if found is not None else None


def _upsert(connection: Connection, conversation_id: str, values: Mapping[str, Any]) -> None:
    dialect = connection.dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = (
        insert(REQUEST_PROFILES)
        .values({**EMPTY_PARTS, **values, "conversation_id": conversation_id})
        .on_conflict_do_update(index_elements=["conversation_id"], set_=dict(values))
    )
    connection.execute(statement)


def save_parts(
    connection: Connection,
    conversation_id: str,
    parts: FixedParts,
    content_hash: str,
    now: datetime,
    sent: Sent | None = None,
    spec: tuple[str, str] | None = None,
) -> None:
    """Record what ``assemble`` was given, and the request it built (one upsert); ``spec`` the
    text of what it was given and its hash, when that changed."""
    values: dict[str, Any] = {
        "system_tokens": parts.system,
        "tools_tokens": parts.tools,
        "reminder_tokens": parts.reminder,
        "context_tokens": parts.context,
        "content_hash": content_hash,
        "assembled_at": now,
    }
    if sent is not None:
        values |= {
            "sent_tokens": sent.tokens,
            "sent_leaf_message_id": sent.leaf_id,
            "sent_state": sent.state,
            "sent_kinds": kinds_of.encode(sent.composition),
        }
    if spec is not None:
        values |= {"sent_spec": spec[0], "sent_spec_hash": spec[1]}
    _upsert(connection, conversation_id, values)


def save_reading(
    connection: Connection,
    conversation_id: str,
    *,
    estimated: int,
    measured: int,
    leaf_id: int | None,
    now: datetime,
    state: str | None = None,
    fitted: calibration.KindFactors | None = None,
) -> None:
    """Record the provider's latest reading beside Recap's count of the same request, and the
    rates per kind of content fitted over the recent readings (None: none of known
    composition)."""
    _upsert(
        connection,
        conversation_id,
        {
            "usage_estimated_tokens": estimated,
            "usage_prompt_tokens": measured,
            "usage_leaf_message_id": leaf_id,
            "usage_at": now,
            "usage_state": state,
            "usage_kinds": fitted.encode() if fitted is not None else None,
        },
    )


def save_reserve(connection: Connection, conversation_id: str, tokens: int | None) -> None:
    """Set (or with None, drop) the conversation's own output reserve."""
    _upsert(connection, conversation_id, {"reserve_output_tokens": tokens})
