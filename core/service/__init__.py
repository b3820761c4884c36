"""Engine-level operations for hosts, the CLI, the console and ``recap serve``: each opens its own
short session. Conversations as a whole live in ``conversations.py``, the request path (read,
assemble) in ``assembling.py``, what a request records in ``recording.py``; their public names
are here."""

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

__all__ = [
    "Attached",
    "MergeStarted",
    "Prepare",
    "Recording",
    "add_many",
    "add_message",
    "assemble",
    "assemble_unrecorded",
    "attach",
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
]
