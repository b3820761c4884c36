"""Engine-level operations for hosts, the CLI, the console and ``recap serve``: each opens its own
short session. Conversations as a whole live in ``conversations.py``, the request path (read,
assemble) in ``assembling.py``, what a request records in ``recording.py``, attach and merge in
``attaching.py``; the console's reads in ``console.py``, the database as a whole in
``database.py``, the maintenance run now in ``maintenance.py``, a user's memory in
``memories.py`` and ``recap serve``'s writes and what its response ids name in ``serving.py``.
The public names of the first four are here, with the ingest step new messages go through
(``Ingest``), whether a conversation is stored, and the store's clock."""

from __future__ import annotations

from recap.core.service.assembling import (
    assemble,
    assemble_unrecorded,
    media_policy,
    merge,
)
from recap.core.service.attaching import Attached, MergeStarted, attach, merges
from recap.core.service.conversations import (
    Prepare,
    add_many,
    add_message,
    conversation_meta,
    conversation_stats,
    export_conversation,
    import_conversations,
    list_summaries,
    new_conversation,
    read_import_file,
    record_usage,
    set_conversation_meta,
    set_output_reserve,
)
from recap.core.service.recording import Recording
from recap.core.storage.erase import conversation_exists  # one short read: an engine operation
from recap.core.storage.models import utcnow  # the clock every stored time is read by
from recap.core.storage.outputs import Ingest  # the ingest step (``Prepare``) a door applies

__all__ = [
    "Attached",
    "Ingest",
    "MergeStarted",
    "Prepare",
    "Recording",
    "add_many",
    "add_message",
    "assemble",
    "assemble_unrecorded",
    "attach",
    "conversation_exists",
    "conversation_meta",
    "conversation_stats",
    "export_conversation",
    "import_conversations",
    "list_summaries",
    "media_policy",
    "merge",
    "merges",
    "new_conversation",
    "read_import_file",
    "record_usage",
    "set_conversation_meta",
    "set_output_reserve",
    "utcnow",
]
