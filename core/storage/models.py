"""The schema: conversations, an append-only message tree, and what compression records beside it.

Messages are never updated or deleted by compression. Summaries, clearings and the compaction log
are rows of their own, and the request view is derived from all of them.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlmodel import Field, SQLModel

# The predicate of the partial index of tool results; a query states it word for word (a literal,
# not a bound parameter) for either database to use that index.
TOOL_ONLY = "role = 'tool'"

# SQLite only auto-increments INTEGER PRIMARY KEY; PostgreSQL gets a 64-bit identity.
ID_TYPE = BigInteger().with_variant(Integer(), "sqlite")
# Ids are never handed out twice, on SQLite too (its ``AUTOINCREMENT``; without it a deleted
# conversation's newest ids went to the next rows stored): a cutoff, a clearing or a recall
# reference naming an erased message never names another's (migration 0013).
NEVER_REUSED: dict[str, Any] = {"sqlite_autoincrement": True}
INCARNATION_CHARS = 32  # a random token in hex (``new_incarnation``)


def utcnow() -> datetime:
    """Timezone-aware now, the only clock the schema uses."""
    return datetime.now(UTC)


def new_incarnation() -> str:
    """A fresh incarnation token: a conversation created again under an erased id gets another
    one, so what was read from the erased conversation is never written into the new one."""
    return secrets.token_hex(INCARNATION_CHARS // 2)


class Conversation(SQLModel, table=True):
    """One chat or agent run; the lease fields give one compression run at a time."""

    __tablename__ = "conversations"

    id: str = Field(primary_key=True, max_length=255)
    model: str = Field(max_length=255)
    max_input_tokens: int | None = None
    meta: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    last_activity_at: datetime = Field(
        sa_column=Column(DateTime(timezone=True), nullable=False, index=True)
    )
    lease_owner: str | None = Field(default=None, max_length=64)
    lease_expires_at: datetime | None = Field(
        default=None, sa_column=Column(DateTime(timezone=True), nullable=True)
    )
    dirty: bool = Field(default=False)
    last_compacted_at: datetime | None = Field(
        default=None, sa_column=Column(DateTime(timezone=True), nullable=True)
    )
    # The fingerprint of the `recap serve` client key that created it (never the key); other
    # keys cannot see it. Unset for conversations created by the library or the CLI.
    owner: str | None = Field(default=None, max_length=64)
    # This life of the id (``new_incarnation``): a run reads it when it takes the lease and
    # every write of the run checks it (``core.storage.store.lock_conversation``).
    incarnation: str = Field(
        default_factory=new_incarnation,
        sa_column=Column(String(INCARNATION_CHARS), nullable=False),
    )


class Message(SQLModel, table=True):
    """One message; ``parent_id`` makes the tree, a branch is the path from a leaf to the root."""

    __tablename__ = "messages"
    __table_args__ = (
        # Paths are read in id order, and the tokens left unread summed, from the index (0012).
        Index("ix_messages_conversation_tree", "conversation_id", "id", "parent_id", "tokens"),
        Index("ix_messages_conversation_tool_call", "conversation_id", "tool_call_id"),
        # `recap serve` maps a resent history onto the tree from hashes, parents and ids alone.
        Index(
            "ix_messages_conversation_hash", "conversation_id", "content_hash", "parent_id", "id"
        ),
        # Each assembly's request version aggregates per basis from the index alone (0011).
        Index("ix_messages_conversation_version", "conversation_id", "encoding", "id", "tokens"),
        # The idle sweep walks tool results alone, in id order (migration 0006).
        Index(
            "ix_messages_tool_results",
            "id",
            "conversation_id",
            postgresql_where=text(TOOL_ONLY),
            sqlite_where=text(TOOL_ONLY),
        ),
        NEVER_REUSED,
    )

    id: int | None = Field(default=None, sa_column=Column(ID_TYPE, primary_key=True))
    conversation_id: str = Field(foreign_key="conversations.id", max_length=255)
    parent_id: int | None = Field(
        default=None, sa_column=Column(ID_TYPE, nullable=True, index=True)
    )
    role: str = Field(max_length=32)
    content: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    content_parts: list[Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    tool_calls: list[Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    tool_call_id: str | None = Field(default=None, max_length=255)
    name: str | None = Field(default=None, max_length=255)
    extra: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    tokens: int = 0
    encoding: str = Field(max_length=32)
    output_path: str | None = Field(default=None, max_length=1024)
    original_bytes: int | None = None
    # core.storage.hashing.message_hash of the message as it arrived (before any truncation).
    content_hash: str | None = Field(default=None, max_length=32)
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


class Summary(SQLModel, table=True):
    """A progressive summary covering a branch up to and including ``cutoff_message_id``."""

    __tablename__ = "summaries"
    __table_args__ = (
        UniqueConstraint("conversation_id", "cutoff_message_id", name="uq_summaries_cutoff"),
        NEVER_REUSED,
    )

    id: int | None = Field(default=None, sa_column=Column(ID_TYPE, primary_key=True))
    conversation_id: str = Field(foreign_key="conversations.id", max_length=255, index=True)
    cutoff_message_id: int = Field(sa_column=Column(ID_TYPE, nullable=False))
    previous_summary_id: int | None = Field(default=None, sa_column=Column(ID_TYPE, nullable=True))
    text: str = Field(sa_column=Column(Text, nullable=False))
    tokens: int
    encoding: str = Field(max_length=32)
    model: str = Field(max_length=255)
    input_tokens: int = 0
    output_tokens: int = 0
    identifier_retention: float = 1.0
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    # Written by a compression run when ready, used from the first request where that pays
    # (``core.decision.activation``): pending until then, ``activated_at`` its first use.
    pending: bool = Field(
        default=False, sa_column=Column(Boolean, nullable=False, server_default=false())
    )
    activated_at: datetime | None = Field(
        default=None, sa_column=Column(DateTime(timezone=True), nullable=True)
    )
    # The provider's own compaction of the same span (``core.compression.provider``): a JSON
    # list of provider items (``core.request.native_items.provider_item``), sent byte for byte
    # to that provider and model in place of the text; NULL when there is none.
    provider_items: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


class Clearing(SQLModel, table=True):
    """One recorded step of how a message renders from now on (``core.values.records``): a tool
    result aged or cleared, a result shortened, media or reasoning no longer sent, old call
    arguments shortened. One-way, one row per message and stage; ``tokens_reclaimed`` is what
    the message's state after the step saves against its stored count."""

    __tablename__ = "clearings"
    __table_args__ = (
        # Per conversation: an attached message is cleared for each conversation's requests
        # on its own (migration 0016).
        UniqueConstraint(
            "conversation_id", "message_id", "stage", name="uq_clearings_message_stage"
        ),
        NEVER_REUSED,
    )

    id: int | None = Field(default=None, sa_column=Column(ID_TYPE, primary_key=True))
    # looked up by conversation through the unique index's first column (migration 0021)
    conversation_id: str = Field(foreign_key="conversations.id", max_length=255)
    # by message: the idle sweep reads back a batch's range of message ids
    message_id: int = Field(sa_column=Column(ID_TYPE, nullable=False, index=True))
    reason: str = Field(max_length=32)
    tokens_reclaimed: int = 0
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    stage: str = Field(
        default="cleared",
        sa_column=Column(String(16), nullable=False, server_default="cleared"),
    )
    kept_chars: int | None = None  # an aged result's character cap


class CompactionLog(SQLModel, table=True):
    """One row per ``compress_session`` run: what triggered it, what it did, what it cost."""

    __tablename__ = "compaction_log"
    __table_args__ = NEVER_REUSED

    id: int | None = Field(default=None, sa_column=Column(ID_TYPE, primary_key=True))
    conversation_id: str = Field(foreign_key="conversations.id", max_length=255, index=True)
    task_id: str | None = Field(default=None, max_length=255)
    trigger: str = Field(max_length=32)
    leaf_message_id: int | None = Field(default=None, sa_column=Column(ID_TYPE, nullable=True))
    action: str = Field(max_length=32)
    reason: str = Field(default="", sa_column=Column(Text, nullable=False))
    tokens_before: int = 0
    tokens_after: int = 0
    summary_id: int | None = Field(default=None, sa_column=Column(ID_TYPE, nullable=True))
    model: str | None = Field(default=None, max_length=255)
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    duration_ms: int = 0
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    # The part of the summarizer's input read from the provider's cache (its request built on
    # the chat's prefix, ``core.compression.prefix``; 0: none or not reported).
    cached_input_tokens: int = Field(
        default=0, sa_column=Column(Integer, nullable=False, server_default="0")
    )
    # Consecutive skipped runs of a conversation share one row
    # (core.storage.compaction_log.record_run): the runs it stands for, and the latest one's time
    # (created_at is the first's).
    repeats: int = Field(default=1, sa_column=Column(Integer, nullable=False, server_default="1"))
    last_seen_at: datetime | None = Field(
        default=None, sa_column=Column(DateTime(timezone=True), nullable=True)
    )


class Usage(SQLModel, table=True):
    """Provider-reported usage of one request, against Recap's estimate of the same request."""

    __tablename__ = "usage"
    __table_args__ = NEVER_REUSED

    id: int | None = Field(default=None, sa_column=Column(ID_TYPE, primary_key=True))
    conversation_id: str = Field(foreign_key="conversations.id", max_length=255, index=True)
    leaf_message_id: int | None = Field(default=None, sa_column=Column(ID_TYPE, nullable=True))
    estimated_tokens: int
    prompt_tokens: int
    completion_tokens: int = 0
    cached_tokens: int = 0
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    # Prompt tokens the provider wrote to its cache (Anthropic's cache creation; 0: none or not
    # reported).
    cache_write_tokens: int = Field(
        default=0, sa_column=Column(Integer, nullable=False, server_default="0")
    )
    # The measured request's estimate split by kind of content (``core.counting.kinds``), when
    # Recap assembled it: what the calibration per kind is fitted from.
    kinds: str | None = Field(default=None, max_length=96)


class RequestProfile(SQLModel, table=True):
    """What the host last sent beside the stored history (token counts and a hash; the text of
    its system prompt, tools and reminder only as ``sent_spec``), the latest provider reading
    that calibrates the estimate, and the conversation's output reserve override: the inputs of
    ``core.counting.budget`` that ``assemble`` and ``record_usage`` learn, one row per
    conversation."""

    __tablename__ = "request_profiles"

    conversation_id: str = Field(primary_key=True, foreign_key="conversations.id", max_length=255)
    system_tokens: int = 0
    tools_tokens: int = 0
    reminder_tokens: int = 0
    context_tokens: int = 0
    content_hash: str | None = Field(default=None, max_length=64)
    assembled_at: datetime | None = Field(
        default=None, sa_column=Column(DateTime(timezone=True), nullable=True)
    )
    reserve_output_tokens: int | None = None
    usage_estimated_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    usage_leaf_message_id: int | None = Field(
        default=None, sa_column=Column(ID_TYPE, nullable=True)
    )
    usage_at: datetime | None = Field(
        default=None, sa_column=Column(DateTime(timezone=True), nullable=True)
    )
    sent_tokens: int | None = None
    sent_leaf_message_id: int | None = Field(default=None, sa_column=Column(ID_TYPE, nullable=True))
    sent_state: str | None = Field(default=None, max_length=64)
    usage_state: str | None = Field(default=None, max_length=64)
    sent_kinds: str | None = Field(default=None, max_length=96)  # the sent request's composition
    usage_kinds: str | None = Field(default=None, max_length=96)  # the rates fitted per kind
    # What the last request was given beside the history, as JSON (its system prompt, tools,
    # reminder and rendering: ``core.compression.prefix``), written only when it changes
    # (``sent_spec_hash``); the worker builds the chat's prefix again from it.
    sent_spec: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    sent_spec_hash: str | None = Field(default=None, max_length=64)


class Pin(SQLModel, table=True):
    """A message sent verbatim in every request of its branches: in its place, or right after
    the summary once a summary covers it; never cleared, aged or shortened. Unpinning deletes
    the row (a pin, unlike a clearing, is not one-way)."""

    __tablename__ = "pins"
    __table_args__ = (UniqueConstraint("message_id", name="uq_pins_message"), NEVER_REUSED)

    id: int | None = Field(default=None, sa_column=Column(ID_TYPE, primary_key=True))
    conversation_id: str = Field(foreign_key="conversations.id", max_length=255, index=True)
    message_id: int = Field(sa_column=Column(ID_TYPE, nullable=False))
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


class Attachment(SQLModel, table=True):
    """An attach pointer: the open and close marker messages on the conversation's branch, and
    the source branch (another conversation's, or another branch of this one, up to
    ``source_leaf_id``) expanded between them when a request is assembled
    (``core.request.attach``). A merge's peers are attachments of ``kind`` merge; the base peer
    is ``locked`` (sent as stored) until the merge commits."""

    __tablename__ = "attachments"
    __table_args__ = NEVER_REUSED

    id: int | None = Field(default=None, sa_column=Column(ID_TYPE, primary_key=True))
    conversation_id: str = Field(foreign_key="conversations.id", max_length=255, index=True)
    open_message_id: int = Field(sa_column=Column(ID_TYPE, nullable=False))
    close_message_id: int = Field(sa_column=Column(ID_TYPE, nullable=False))
    source_conversation_id: str = Field(max_length=255)
    source_incarnation: str | None = Field(default=None, max_length=32)
    source_leaf_id: int | None = Field(default=None, sa_column=Column(ID_TYPE, nullable=True))
    # The source branch's stored tokens when attached: the early bound of a compression run
    # counts them (``core.storage.snapshot.history_bound``).
    source_tokens: int = Field(
        default=0, sa_column=Column(Integer, nullable=False, server_default="0")
    )
    kind: str = Field(max_length=16)
    locked: bool = False
    merge_id: int | None = Field(default=None, sa_column=Column(ID_TYPE, nullable=True))
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


class Merge(SQLModel, table=True):
    """A merge of peer branches into a conversation's branch: its previous head, the peers'
    heads (``[conversation, leaf]`` pairs), the instruction message, and the reply that commits
    it (None until added). The commit is the one message with several parents: the previous
    head and each peer's head."""

    __tablename__ = "merges"
    __table_args__ = NEVER_REUSED

    id: int | None = Field(default=None, sa_column=Column(ID_TYPE, primary_key=True))
    conversation_id: str = Field(foreign_key="conversations.id", max_length=255, index=True)
    base_head_id: int | None = Field(default=None, sa_column=Column(ID_TYPE, nullable=True))
    instruction_message_id: int = Field(sa_column=Column(ID_TYPE, nullable=False))
    peers: list[Any] = Field(sa_column=Column(JSON, nullable=False))
    commit_message_id: int | None = Field(default=None, sa_column=Column(ID_TYPE, nullable=True))
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


class Memory(SQLModel, table=True):
    """One entry of a user's memory (``core.values.memory``): unique per user and key; the
    conversation and message that last wrote it, so erasing a conversation erases what it
    contributed (every table with a ``conversation_id`` is erased with it)."""

    __tablename__ = "memories"
    __table_args__ = (UniqueConstraint("user_id", "key", name="uq_memories_user_key"), NEVER_REUSED)

    id: int | None = Field(default=None, sa_column=Column(ID_TYPE, primary_key=True))
    user_id: str = Field(max_length=255, index=True)
    key: str = Field(max_length=64)
    text: str = Field(sa_column=Column(Text, nullable=False))
    tokens: int = 0
    uses: int = 1
    conversation_id: str | None = Field(
        default=None, foreign_key="conversations.id", max_length=255, index=True
    )
    message_id: int | None = Field(default=None, sa_column=Column(ID_TYPE, nullable=True))
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    updated_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


class MemoryRun(SQLModel, table=True):
    """One extraction that wrote its result: unique per user, conversation and turn (the leaf
    it read), so a redelivered task finds its turn done and writes nothing again."""

    __tablename__ = "memory_runs"
    __table_args__ = (
        UniqueConstraint("user_id", "conversation_id", "message_id", name="uq_memory_runs_turn"),
        NEVER_REUSED,
    )

    id: int | None = Field(default=None, sa_column=Column(ID_TYPE, primary_key=True))
    user_id: str = Field(max_length=255)
    conversation_id: str = Field(foreign_key="conversations.id", max_length=255, index=True)
    message_id: int = Field(sa_column=Column(ID_TYPE, nullable=False))
    task_id: str | None = Field(default=None, max_length=255)
    edits: int = 0
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


class MemoryUser(SQLModel, table=True):
    """A user's own switch: ``enabled`` False turns memory off for them (nothing extracted,
    nothing injected). A user without a row has memory on, as the settings allow."""

    __tablename__ = "memory_users"

    user_id: str = Field(primary_key=True, max_length=255)
    enabled: bool = True
    updated_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


def table_of(model: type[SQLModel]) -> Table:
    """The Core table of a model, for hot-path reads that skip the ORM's per-row work."""
    table = model.__table__  # type: ignore[attr-defined]
    assert isinstance(table, Table)
    return table


CONVERSATIONS = table_of(Conversation)
MESSAGES = table_of(Message)
SUMMARIES = table_of(Summary)
CLEARINGS = table_of(Clearing)
REQUEST_PROFILES = table_of(RequestProfile)
PINS = table_of(Pin)
ATTACHMENTS = table_of(Attachment)
MERGES = table_of(Merge)
MEMORIES = table_of(Memory)
MEMORY_RUNS = table_of(MemoryRun)
MEMORY_USERS = table_of(MemoryUser)
