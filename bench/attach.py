"""Assembling a request that carries attachments, against the same messages stored inline.

- ``attach_assemble_vs_plain``: ``assemble`` of a conversation whose branch holds 5 attachments
  (each a sub-agent conversation of 6 tool-using turns) between its own 20 turns, over
  ``assemble`` of a conversation holding the same messages inline (the same tokens, less the
  markers); medians of alternating rounds, on SQLite, nothing recorded. Bound: <= 1.3.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import Figure

ATTACHMENTS = 5
SUB_TURNS = 6
OWN_TURNS = 20
ROUNDS = 41


def turn(tag: str, n: int) -> list[dict[str, Any]]:
    """One tool-using turn: a question, a call, its result, an answer."""
    call = f"call_{tag}_{n}"
    words = " ".join(f"{tag}w{n}x{i}" for i in range(60))
    return [
        {"role": "user", "content": f"question {tag} {n}: {words[:200]}"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call, "type": "function", "function": {"name": "look", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": call, "content": f"result {n}: {words}"},
        {"role": "assistant", "content": f"answer {tag} {n}: {words[:160]}"},
    ]


def run() -> list[Figure]:
    from recap.core import service
    from recap.core.settings import Settings
    from recap.core.storage.db import make_engine
    from recap.core.storage.migrate import upgrade

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        settings = Settings(database_url=f"sqlite:///{root / 'attach.db'}", output_dir=root / "o")
        engine = make_engine(settings.database_url)
        upgrade(engine)
        window = 1_000_000
        for cid in ("inline", "attached"):
            service.new_conversation(engine, settings, cid, model="gpt-4o", max_input_tokens=window)
        per = OWN_TURNS // ATTACHMENTS
        for a in range(ATTACHMENTS):
            sub = f"sub{a}"
            service.new_conversation(engine, settings, sub, model="gpt-4o", max_input_tokens=window)
            own = [m for n in range(per) for m in turn(f"p{a}", n)]
            work = [m for n in range(SUB_TURNS) for m in turn(sub, n)]
            service.add_many(engine, sub, work)
            service.add_many(engine, "inline", [*own, *work])
            service.add_many(engine, "attached", own)
            service.attach(engine, "attached", sub)
        for cid in ("inline", "attached"):
            service.add_message(engine, cid, {"role": "user", "content": "sum it up"})
        plain: list[float] = []
        attached: list[float] = []
        for n in range(ROUNDS):
            sides = [("inline", plain), ("attached", attached)]
            for cid, times in sides if n % 2 else sides[::-1]:
                started = time.perf_counter()
                service.assemble(engine, cid, settings, record=False)
                times.append(time.perf_counter() - started)
        tokens = {
            cid: service.assemble(engine, cid, settings, record=False).tokens.history
            for cid in ("inline", "attached")
        }
        engine.dispose()
    plain_ms, attached_ms = statistics.median(plain) * 1000, statistics.median(attached) * 1000
    return [
        Figure(
            "attach_assemble_vs_plain",
            round(attached_ms / plain_ms, 3),
            "<= 1.3",
            f"assemble with {ATTACHMENTS} attachments ({attached_ms:.2f} ms, "
            f"{tokens['attached']} history tokens) over the same messages inline "
            f"({plain_ms:.2f} ms, {tokens['inline']} tokens); SQLite, medians of "
            f"{ROUNDS} alternating rounds",
        )
    ]
