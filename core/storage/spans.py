"""The files and media of a summarized span: what the model can no longer see once a summary
stands in for it, listed in ``forgotten_files`` and offered for recall.

The span (root to the summary's cutoff) never changes, so it is read once per summary and process
and kept in a small cache keyed on the database, the conversation and the summary.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from sqlalchemy import Text, or_, select, type_coerce
from sqlmodel import Session

from recap.core.counting import media
from recap.core.storage import reads
from recap.core.storage.models import MESSAGES
from recap.core.values.records import SummaryRec

SPAN_CACHE_SIZE = 1_024  # summaries whose span's files are kept listed in this process
_span_cache: OrderedDict[tuple[str, str, int, int, str], tuple[tuple[str, ...], ...]] = (
    OrderedDict()
)
_span_lock = threading.Lock()


def span_forgotten(
    session: Session,
    conversation_id: str,
    summary: SummaryRec,
    leaf: int | None,
    root: Path,
) -> list[str]:
    """What the model can no longer see of the span ``summary`` covers: the saved files of its
    cut tool outputs and arguments (as recorded: one may have expired since) and the names of
    its media.

    The span (root to cutoff) never changes, so it is read once per summary and process (one
    read of the span's rows that name a file or hold media), and a request pays a lookup."""
    del leaf, root  # the span is the path to the cutoff, whatever branch continues it
    key = (
        str(session.connection().engine.url),
        conversation_id,
        summary.id,
        summary.cutoff_message_id,
        summary.created_at.isoformat() if summary.created_at else "",
    )
    with _span_lock:
        listed = _span_cache.get(key)
    if listed is None:
        path = reads.branch_path(session.connection(), conversation_id, summary.cutoff_message_id)
        rows = span_files(session, conversation_id, path, summary.cutoff_message_id)
        files = tuple(str(p) for _, p, _ in rows if p)
        names = tuple(n for _, _, parts in rows if parts for n in media.names(parts))
        listed = (files, names)
        with _span_lock:
            _span_cache[key] = listed
            while len(_span_cache) > SPAN_CACHE_SIZE:
                _span_cache.popitem(last=False)
    files, names = listed
    return [*dict.fromkeys(files), *dict.fromkeys(names)]


def span_files(
    session: Session, conversation_id: str, path: list[int], cutoff: int
) -> list[tuple[int, str | None, Any]]:
    """The messages of the branch ``path`` up to ``cutoff`` that name a saved file or hold
    media: (id, output path, content parts). One range read of those rows' file columns."""
    m = MESSAGES.c
    statement = select(m.id, m.output_path, type_coerce(m.content_parts, Text)).where(
        m.conversation_id == conversation_id,
        m.id <= cutoff,
        or_(m.output_path.is_not(None), m.content_parts.is_not(None)),
    )
    on_path = set(path)
    rows = session.connection().execute(statement)
    return [
        (int(row[0]), row[1], reads.json_value(row[2]))
        for row in rows
        if row[0] in on_path and (row[1] is not None or reads.holds_media(row[2]))
    ]
