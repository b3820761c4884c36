"""Token accounting: counting from scratch against tiktoken, stored counts against litellm."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from bench import Figure, best_of_each
from bench.data import load_all

MODEL = "gpt-4o-mini"
REPEATS = 7  # best of seven, the two sides taken in turn: the least disturbed run of each


def texts_of(message: dict[str, Any]) -> list[str]:
    """The strings a message's count is made of, for the plain-tiktoken baseline."""
    from recap.core.counting.tokens import content_text

    parts = [message["role"], content_text(message.get("content"))]
    parts += [message[k] for k in ("name", "tool_call_id") if message.get(k)]
    for call in message.get("tool_calls") or ():
        fn = call.get("function") or {}
        parts += [call.get("id", ""), fn.get("name", ""), fn.get("arguments", "")]
    return [p for p in parts if p]


def cold(messages: list[dict[str, Any]]) -> Figure:
    from recap.core.counting import tokens

    encoding = tokens.encoding_name_for(MODEL)
    enc = tokens.get_encoding(encoding)
    texts = [t for m in messages for t in texts_of(m)]
    baseline, ours = best_of_each(
        [
            lambda: [len(enc.encode_ordinary(t)) for t in texts],
            lambda: [tokens.count_message(m, encoding) for m in messages],
        ],
        REPEATS,
    )
    return Figure(
        "tokens_cold_vs_tiktoken",
        round(ours / baseline, 3),
        "<= 1.3",
        f"count_message over all {len(messages)} messages of the shared data, against "
        "tiktoken encode_ordinary over the same strings",
    )


def warm(records: list[dict[str, Any]]) -> list[Figure]:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    from recap.core import service
    from recap.core.request.branch import effective_history_tokens
    from recap.core.settings import load_settings
    from recap.core.storage import reads, snapshot
    from recap.core.storage.db import make_engine, session_scope
    from recap.core.storage.migrate import upgrade

    with tempfile.TemporaryDirectory() as folder:
        engine = make_engine(f"sqlite:///{Path(folder) / 'bench.db'}")
        upgrade(engine)
        service.import_conversations(engine, records, load_settings())
        ids = [r["id"] for r in records]
        with session_scope(engine) as session:
            states = [reads.load_whole_branch(session, cid) for cid in ids]

        def in_memory() -> None:
            for s in states:
                effective_history_tokens(s.branch, s.summary, s.clearings)

        def from_db() -> None:
            for cid in ids:
                with session_scope(engine) as session:
                    s = snapshot.read_snapshot(session, cid)
                effective_history_tokens(s.branch, s.summary, s.clearings)

        def naive() -> None:
            for r in records:
                litellm.token_counter(model=MODEL, messages=r["messages"])

        naive()  # warm litellm's own caches so it is not charged for loading its encodings
        theirs, ours, ours_db = best_of_each([naive, in_memory, from_db], 3)
        engine.dispose()
    return [
        Figure(
            "tokens_warm_vs_litellm",
            round(theirs / ours, 1),
            ">= 20",
            f"litellm.token_counter over all {len(records)} conversations divided by Recap's "
            "count of the same loaded branches from their stored per-message counts",
        ),
        Figure(
            "tokens_warm_from_db_vs_litellm",
            round(theirs / ours_db, 1),
            "",
            "the same, with Recap reading each branch's ids and counts from SQLite in its own "
            "session (per-query overhead dominates small conversations)",
        ),
    ]


def run() -> list[Figure]:
    records = load_all()
    messages = [m for r in records for m in r["messages"]]
    return [cold(messages), *warm(records)]
