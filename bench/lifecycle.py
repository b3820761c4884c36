"""Erasure and the timeline against their floors.

Twelve agent conversations of 600 messages each (200 tool results, a third of them saved to a
file on the way in) and a hundred small ones are stored in SQLite. ``delete_vs_raw_delete`` is
the CPU time of ``Recap.delete`` (the lock, every row of every table, the shared-file check, the
files) over plain ``DELETE`` statements of the same rows of another such conversation, deciding
nothing and touching no file. ``timeline_vs_assemble`` is the CPU time of ``recap timeline``'s
work (the whole branch read, a request assembled, the states derived) over one ``assemble``.
``assemble_span_lookup_vs_none`` is one ``assemble`` of a summarized conversation (its span's
files listed in ``forgotten_files``) over the same with the list's lookup skipped.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from sqlalchemy import Engine, text

from bench import Figure, best_of_each
from recap.core.settings import Settings

CONVERSATIONS = 12
TURNS = 150  # four messages a turn: 600 messages
SMALL = 100
REPEATS = 5  # deletes per side: 2 x 5 of the conversations


def _messages(tag: int) -> list[dict[str, object]]:
    out: list[dict[str, object]] = [{"role": "system", "content": "You are a coding agent."}]
    for n in range(TURNS):
        lines = 40 if n % 3 == 0 else 8  # over the 20-line limit: saved to a file
        output = "\n".join(
            f"src/mod_{tag}_{n}.py:{i}: def handler_{i}(): pass" for i in range(lines)
        )
        call = {"id": f"c{n}", "type": "function", "function": {"name": "grep", "arguments": "{}"}}
        out += [
            {"role": "user", "content": f"step {n} of run {tag}: " + "look further " * 20},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{n}", "name": "grep", "content": output},
            {"role": "assistant", "content": f"found {n} " + "and so on " * 20},
        ]
    return out


def _raw_delete(engine: Engine, conversation_id: str) -> None:
    with engine.begin() as connection:
        for table in ("clearings", "summaries", "compaction_log", "usage", "request_profiles"):
            connection.execute(
                text(f"DELETE FROM {table} WHERE conversation_id = :c"), {"c": conversation_id}
            )
        connection.execute(text("DELETE FROM messages WHERE conversation_id = :c"),
                           {"c": conversation_id})  # fmt: skip
        connection.execute(text("DELETE FROM conversations WHERE id = :c"), {"c": conversation_id})


def run(data: list[Path] | None = None) -> list[Figure]:
    del data
    folder = tempfile.mkdtemp(prefix="recap-bench-lifecycle-")
    os.environ["RECAP_OUTPUT_DIR"] = str(Path(folder) / "outputs")
    os.environ["RECAP_MAX_OUTPUT_LINES"] = "20"
    from recap.core import lifecycle, service
    from recap.core.client import Recap
    from recap.core.settings import load_settings
    from recap.core.storage import db

    settings = load_settings(database_url=f"sqlite:///{folder}/recap.db")
    engine = db.make_engine(settings.database_url)
    recap = Recap(settings, engine, create_schema=True)
    records = [{"id": f"big-{n:02d}", "messages": _messages(n)} for n in range(CONVERSATIONS)]
    records += [{"id": f"small-{n:03d}", "messages": _messages(1000 + n)[:9]} for n in range(SMALL)]
    service.import_conversations(engine, records, settings, prepare=recap._ingest)

    ours = iter(f"big-{n:02d}" for n in range(0, 2 * REPEATS, 2))
    raws = iter(f"big-{n:02d}" for n in range(1, 2 * REPEATS, 2))
    delete, raw = best_of_each(
        [lambda: recap.delete(next(ours)), lambda: _raw_delete(engine, next(raws))], REPEATS
    )

    kept = f"big-{CONVERSATIONS - 1:02d}"
    line, one = best_of_each(
        [
            lambda: lifecycle.timeline(engine, kept, settings),
            lambda: service.assemble(engine, kept, settings, record=False),
        ],
        REPEATS,
    )
    recap.compress(kept, force=True)
    looked, skipped = best_of_each(
        [
            lambda: service.assemble(engine, kept, settings, record=False),
            lambda: _assemble_without_lookup(engine, kept, settings),
        ],
        REPEATS * 4,
    )
    return [
        Figure(
            "delete_vs_raw_delete",
            round(delete / raw, 2),
            "",
            "CPU of Recap.delete (600 messages, ~50 files) over raw DELETEs of the same rows",
        ),
        Figure(
            "timeline_vs_assemble",
            round(line / one, 2),
            "",
            "CPU of recap timeline's work over one assemble of the same 600-message branch",
        ),
        Figure(
            "assemble_span_lookup_vs_none",
            round(looked / skipped, 3),
            "<= 1.2",
            "one assemble of a summarized branch, its span's files listed, over without the list",
        ),
    ]


def _assemble_without_lookup(engine: Engine, cid: str, settings: Settings) -> None:
    """``assemble`` with the summarized span's file list left out (the figure's baseline)."""
    import recap.core.service as module

    saved = module._span_forgotten
    module._span_forgotten = lambda *args, **kwargs: []
    try:
        module.assemble(engine, cid, settings, record=False)
    finally:
        module._span_forgotten = saved
