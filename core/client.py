"""``Recap``: the host's handle on one database, with the settings applied.

A host app (a chat or agent backend) uses it on its request path: add each message as it
arrives (large tool outputs are truncated on the way in), assemble the request before each model
call, record the usage the provider reports. Enqueuing ``recap.compress_session`` after the turn
is a Celery call the host makes itself (see the README), so this module never imports Celery.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine

from recap.core import metrics, service, tracing
from recap.core.request import assembly
from recap.core.results import (
    CompressResult,
    ExportedConversation,
    PinResult,
    Stats,
    SummaryInfo,
    UsageRecorded,
)
from recap.core.settings import Settings, get_settings
from recap.core.storage.db import get_engine, require_schema
from recap.core.storage.outputs import Ingest
from recap.core.storage.reuse import BranchReuse
from recap.core.values.request import ContextFile, RequestSpec, request_from

if TYPE_CHECKING:
    from recap.core.compression.run import Parts
    from recap.core.recall import Recalled
    from recap.core.values.memory import MemoryRec


class Recap:
    """Conversations in one database, read and written with one set of settings."""

    def __init__(
        self,
        settings: Settings | None = None,
        engine: Engine | None = None,
        *,
        create_schema: bool = False,
        parts: Parts | None = None,
    ) -> None:
        """Open the database; a ``SchemaMissingError`` (``run recap init``) when it has no
        Recap schema. ``create_schema=True`` creates or migrates it instead, as ``recap init``
        does: for tests and single-process scripts (deployments run ``recap init`` once).
        ``parts`` gives ``compress`` a summarizer and a reporter of its own (default: what the
        installation provides, see ``core.compression.run.installed_parts``)."""
        self.settings = settings or get_settings()
        self.parts = parts
        self.engine = engine or get_engine(self.settings.database_url, create=create_schema)
        if create_schema:
            from recap.core.storage.migrate import upgrade

            upgrade(self.engine)
        else:
            require_schema(self.engine)
        self._ingest = Ingest.from_settings(self.settings)
        self._reuse = BranchReuse()  # each request's read, for the next (core.storage.reuse)

    def new(
        self,
        conversation_id: str | None = None,
        *,
        model: str | None = None,
        max_input_tokens: int | None = None,
    ) -> str:
        """Create an empty conversation; its id (a UUID unless given)."""
        return service.new_conversation(
            self.engine,
            self.settings,
            conversation_id,
            model=model,
            max_input_tokens=max_input_tokens,
        )

    def add(
        self, conversation_id: str, message: Mapping[str, Any], *, parent_id: int | None = None
    ) -> int:
        """Append an OpenAI-format message after the branch head (or branch from
        ``parent_id``); its id. Safe from many threads or processes at once: appends to one
        conversation take its lock in turn, so they all land on its branch."""
        return service.add_message(
            self.engine, conversation_id, message, parent_id=parent_id, prepare=self._ingest
        )

    def add_many(
        self,
        conversation_id: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        parent_id: int | None = None,
    ) -> list[int]:
        """Append one turn's messages (an assistant message and its tool results, say) in one
        transaction, all or nothing; their ids."""
        return service.add_many(
            self.engine, conversation_id, messages, parent_id=parent_id, prepare=self._ingest
        )

    def assemble(
        self,
        conversation_id: str,
        *,
        leaf: int | None = None,
        system: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        reminder: str | None = None,
        context_files: Iterable[ContextFile] = (),
        text_only: bool = False,
        cache_breakpoints: bool | None = None,
        model: str | None = None,
        max_input_tokens: int | None = None,
        as_of: datetime | None = None,
        request: RequestSpec | None = None,
        user_id: str | None = None,
    ) -> assembly.AssembledRequest:
        """The request to send now: ``.messages`` for the model, ``.tokens`` for accounting.

        ``model`` previews the request for another model (its window and tokenizer) without
        changing the conversation's; ``max_input_tokens`` overrides the window for this request.
        ``as_of`` builds the request as it was at that time (only the summaries, clearings and
        pins recorded by then), writing nothing. ``user_id`` sends that user's memory with the
        request (``RECAP_MEMORY`` ``read`` or ``on``, the user's switch on; see
        ``Recap.memories``).

        The keyword parts build one ``RequestSpec``; a host may pass that value as ``request``
        instead (then giving a part besides it is an ``InputError``)."""
        spec = request_from(
            request,
            system=system,
            tools=tools,
            reminder=reminder,
            context_files=tuple(context_files),
            text_only=text_only,
            cache_breakpoints=cache_breakpoints,
            model=model,
            max_input_tokens=max_input_tokens,
            as_of=as_of,
            user_id=user_id,
        )
        since = metrics.started()
        with tracing.span("recap.assemble", {"recap.conversation_id": conversation_id}) as span:
            assembled = service.assemble(
                self.engine, conversation_id, self.settings, spec, leaf=leaf, reuse=self._reuse
            )
            if span.is_recording():
                span.set_attributes(tracing.assembled_attributes(assembled))
        metrics.assembled(since, assembled)
        return assembled

    def assemble_unrecorded(
        self, conversation_id: str, request: RequestSpec, *, leaf: int | None = None
    ) -> tuple[assembly.AssembledRequest, service.Recording | None]:
        """``assemble`` with its writes handed back: the request, and the ``Recording`` of it
        (the profile ``record_usage`` compares with, media aged, counts made anew) for the
        caller to ``write()`` before its next request of the conversation and before recording
        the usage: a proxy writes it while the model answers. None for an ``as_of`` request."""
        with tracing.span("recap.assemble", {"recap.conversation_id": conversation_id}) as span:
            assembled, recording = service.assemble_unrecorded(
                self.engine, conversation_id, self.settings, request, leaf=leaf, reuse=self._reuse
            )
            if span.is_recording():
                span.set_attributes(tracing.assembled_attributes(assembled))
        return assembled, recording

    def record_usage(
        self,
        conversation_id: str,
        *,
        prompt_tokens: int,
        completion_tokens: int = 0,
        cached_tokens: int = 0,
        leaf: int | None = None,
        cache_write_tokens: int = 0,
    ) -> UsageRecorded:
        """Store the provider's usage for the request sent at ``leaf`` (calibrates estimates).

        ``prompt_tokens`` is the whole input, cached or not; ``cached_tokens`` the part read from
        the provider's cache (OpenAI's ``cached_tokens``, Anthropic's
        ``cache_read_input_tokens``), ``cache_write_tokens`` the part written to it (Anthropic's
        ``cache_creation_input_tokens``). ``stats`` reports the cache hit rate from them."""
        return service.record_usage(
            self.engine,
            conversation_id,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
            leaf=leaf,
            cache_write_tokens=cache_write_tokens,
        )

    def compress(
        self, conversation_id: str, *, leaf: int | None = None, force: bool = False
    ) -> CompressResult:
        """Compress now, in this process, so that the next request fits: the worker's own run
        (``recap.compress_session``'s code path and lease, so it never races a worker; when a
        worker holds the lease this waits for it, then checks again). Returns the object
        ``recap compress --json`` prints, typed. Call it on ``BudgetError`` or on the provider's
        context-overflow error, then retry the request once."""
        from recap.core.compression.inplace import compress_now
        from recap.core.compression.run import installed_parts

        parts = self.parts or installed_parts()
        return compress_now(self.engine, self.settings, conversation_id, leaf, force, parts=parts)

    def set_output_reserve(self, conversation_id: str, output_tokens: int | None) -> None:
        """Keep ``output_tokens`` free for the reply in this conversation (0: none, as for a
        model whose window is for input alone); None returns to the default rule."""
        service.set_output_reserve(self.engine, conversation_id, output_tokens)

    def stats(self, conversation_id: str, *, leaf: int | None = None) -> Stats:
        """Context pressure without calling any model."""
        return service.conversation_stats(self.engine, conversation_id, self.settings, leaf)

    def export(
        self, conversation_id: str, *, leaf: int | None = None, full: bool = False
    ) -> ExportedConversation:
        """The branch as stored, in the import format."""
        return service.export_conversation(
            self.engine, conversation_id, leaf, full=full, output_dir=self.settings.output_dir
        )

    def meta(self, conversation_id: str) -> dict[str, Any]:
        """What the host keeps beside the conversation (an import's extra fields, an
        adapter's state), without reading its messages."""
        return service.conversation_meta(self.engine, conversation_id)

    def set_meta(self, conversation_id: str, key: str, value: Any) -> dict[str, Any]:
        """Set one key of the conversation's meta (None removes it): a JSON value of the
        host's, never read by Recap's decisions; the meta it leaves."""
        return service.set_conversation_meta(self.engine, conversation_id, key, value)

    def summaries(self, conversation_id: str) -> list[SummaryInfo]:
        """The conversation's summaries, oldest first."""
        return service.list_summaries(self.engine, conversation_id)

    def recall(
        self, conversation_id: str, ref: str, *, offset: int = 0, max_chars: int | None = None
    ) -> Recalled:
        """The original a placeholder's or summary's ``ref=REF`` names (a cleared tool output,
        the messages a summary covers, a media part), at most ``max_chars`` (default
        ``RECAP_RECALL_MAX_CHARS``) from ``offset`` on; ``.next_offset`` reads on. The model can
        ask for it through the ``recap_recall`` tool (``core.recall.tool_schema()``)."""
        from recap.core import recall

        return recall.recall(
            self.engine, conversation_id, ref, self.settings, offset=offset, max_chars=max_chars
        )

    def pin(self, conversation_id: str, message_id: int) -> PinResult:
        """Send the message verbatim in every request of its branches: in its place, or right
        after the summary once one covers it; it is never cleared, aged or shortened, and its
        tokens are counted as a fixed part of the budget. ``NotFoundError`` when the
        conversation does not hold the message; ``PinLimitError`` when the conversation's
        pinned messages would pass ``RECAP_MAX_PINNED_TOKENS`` (nothing is pinned)."""
        from recap.core import lifecycle

        return lifecycle.pin(self.engine, conversation_id, message_id, self.settings)

    def unpin(self, conversation_id: str, message_id: int) -> PinResult:
        """Undo ``pin``: the message is summarized, cleared and fitted like any other again
        (a message that was not pinned stays as it is)."""
        from recap.core import lifecycle

        return lifecycle.unpin(self.engine, conversation_id, message_id, self.settings)

    def attach(
        self, conversation_id: str, *, source: str, leaf: int | None = None
    ) -> service.Attached:
        """Attach ``source``'s branch ending at ``leaf`` (default: its latest message) after the
        conversation's head: every later request of this branch carries the source's messages
        there, between an open and a close marker, once (``core.request.attach``). A source
        that is erased later leaves one item saying so. ``NotFoundError`` for an unknown
        conversation, source or leaf (another owner's source is refused as unknown)."""
        return service.attach(self.engine, conversation_id, source, leaf=leaf)

    def merge(
        self,
        conversation_id: str,
        *,
        peers: Sequence[int | str],
        instruction: str,
        leaf: int | None = None,
        request: RequestSpec | None = None,
    ) -> service.MergeStarted:
        """Merge ``peers`` (branch heads of this conversation, or other conversations' ids)
        into the branch ending at ``leaf``: each is attached (the first, the base, locked: sent
        as stored for the merge turn), then ``instruction``; ``.request`` is the request to
        send. Adding the reply (``add``, after ``.instruction_id``: the new head) commits the
        merge, whose parents are the previous head and each peer's head."""
        return service.merge(
            self.engine,
            conversation_id,
            self.settings,
            request or RequestSpec(),
            peers=list(peers),
            instruction=instruction,
            leaf=leaf,
            reuse=self._reuse,
        )

    def merges(self, conversation_id: str) -> list[dict[str, Any]]:
        """The conversation's merges, oldest first: instruction, commit (None while open) and
        the commit's parents."""
        return [m.as_dict() for m in service.merges(self.engine, conversation_id)]

    def delete(self, conversation_id: str) -> dict[str, Any]:
        """Delete the conversation and everything derived from it: its messages, summaries,
        clearings, pins, compaction log, usage, request profile and lease, and the files saved
        for it under ``RECAP_OUTPUT_DIR`` (a file another conversation also uses stays). A
        compression running on it ends as skipped, writing nothing. ``NotFoundError`` for an
        unknown id."""
        from recap.core import lifecycle

        return lifecycle.delete(self.engine, conversation_id, self.settings).as_dict()

    # --- a user's memory (docs/memory.md) ---------------------------------------------------

    def memories(self, user_id: str) -> list[MemoryRec]:
        """The user's memory entries, newest first: each with its text, tokens, how often it
        was written, and the conversation and message that last wrote it."""
        from recap.core.storage import memories

        return memories.list_memories(self.engine, user_id)

    def set_memory(self, user_id: str, key: str, text: str) -> MemoryRec:
        """Set one entry of the user's memory by hand; ``MemoryLimitError`` (an ``InputError``)
        when it would take the user past ``RECAP_MEMORY_MAX_TOKENS`` (nothing written)."""
        from recap.core.storage import memories

        return memories.set_memory(
            self.engine, user_id, key, text, cap=self.settings.memory_max_tokens
        )

    def delete_memory(self, user_id: str, key: str | None = None) -> int:
        """Delete one entry, or (no key) all of the user's memory and their switch; how many
        entries went."""
        from recap.core.storage import memories

        return memories.delete_memory(self.engine, user_id, key)

    def set_memory_enabled(self, user_id: str, enabled: bool) -> bool:
        """The user's own switch: off, nothing is extracted from their conversations and
        nothing injected into their requests (their entries are kept until deleted)."""
        from recap.core.storage import memories

        return memories.set_enabled(self.engine, user_id, enabled)

    def export_memories(self, user_id: str) -> dict[str, Any]:
        """Everything kept about the user, as one JSON object (``recap memory export``)."""
        from recap.core.memory.export import export_user

        return export_user(self.engine, user_id)

    def extract_memories(
        self, user_id: str, conversation_id: str, *, leaf: int | None = None
    ) -> dict[str, Any]:
        """Run ``recap.extract_memories`` now, in this process (the worker's own run, with the
        installed extractor: the memory model, else the offline one); its JSON result."""
        from recap.core.memory.run import extract_now

        return extract_now(self.engine, self.settings, user_id, conversation_id, leaf)
