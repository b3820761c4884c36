"""A run that skips: its bound on the history is safe on every tree shape, and it reads with no
write lock held (``core.storage.snapshot.history_bound``, ``workers.compress``, real SQLite and
PostgreSQL)."""

from __future__ import annotations

import random
import sqlite3
from typing import Any

import pytest
from sqlalchemy import Engine, event, insert

from recap.core.client import Recap
from recap.core.decision import policy
from recap.core.settings import Settings
from recap.core.storage.db import session_scope
from recap.core.storage.models import SUMMARIES, utcnow
from recap.core.storage.snapshot import history_bound, read_snapshot
from recap.workers.compress import compress_now

MODEL = "gpt-4o-mini"
SEEDS = range(4)


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _summarize(engine: Engine, conversation_id: str, cutoff: int, tokens: int) -> None:
    """A summary row as a run writes it (only its cutoff and size matter here)."""
    values = {
        "conversation_id": conversation_id,
        "cutoff_message_id": cutoff,
        "text": "summary",
        "tokens": tokens,
        "encoding": "o200k_base",
        "model": "extractive",
        "created_at": utcnow(),
    }
    with session_scope(engine) as session:
        session.connection().execute(insert(SUMMARIES).values(**values))


def _check(engine: Engine, conversation_id: str) -> tuple[int, int | None] | None:
    """The bound, after checking it against the snapshot the decision would read."""
    with session_scope(engine) as session:
        bound = history_bound(session, conversation_id)
        snap = read_snapshot(session, conversation_id)
    if bound is not None:
        assert bound.tokens >= policy.history_estimate(snap)
        assert bound.history == policy.history_estimate(snap)  # what a skip reports, exactly
        assert bound.leaf == snap.leaf_id
    return bound


@pytest.mark.parametrize("seed", SEEDS)
def test_the_bound_holds_on_random_trees(engine: Engine, settings: Settings, seed: int) -> None:
    """Branches, edits and summaries at random: the bound is at least the history the full read
    finds, for the same newest message, or None when the latest summary is off the branch."""
    rng = random.Random(seed)
    recap = Recap(settings, engine)
    cid = recap.new(f"tree{seed}", model=MODEL)
    ids: list[int] = []
    cutoffs: set[int] = set()
    for step in range(20):
        parent = rng.choice(ids) if ids and rng.random() < 0.15 else None
        words = " ".join(f"w{step}" for _ in range(rng.randint(1, 60)))
        ids.append(recap.add(cid, _user(words), parent_id=parent))
        cutoff = rng.choice(ids)
        if rng.random() < 0.15 and cutoff not in cutoffs:
            cutoffs.add(cutoff)
            _summarize(engine, cid, cutoff, rng.randint(5, 80))
            ids.append(recap.add(cid, _user("after")))
        _check(engine, cid)


def test_the_bound_on_each_shape(engine: Engine, settings: Settings) -> None:
    """Empty, one chain, a summary, an edit after the cutoff (the summary applies) and an edit
    before it (another summary might: no bound)."""
    recap = Recap(settings, engine)
    cid = recap.new("shapes", model=MODEL)
    assert _check(engine, cid) == (0, None, 0)
    first = recap.add(cid, _user("one " * 50))
    second = recap.add(cid, _user("two " * 50))
    third = recap.add(cid, _user("three " * 50))
    assert _check(engine, cid) is not None
    _summarize(engine, cid, second, 7)
    bound = _check(engine, cid)
    assert bound is not None and bound[1] == third
    edit = recap.add(cid, _user("three, again"), parent_id=second)
    bound = _check(engine, cid)
    assert bound is not None and bound[1] == edit
    recap.add(cid, _user("one, again"), parent_id=first)
    assert _check(engine, cid) is None


@pytest.mark.parametrize("leaf", [False, True], ids=["from-the-bound", "with-a-leaf"])
def test_a_skip_reads_with_no_write_lock(
    sqlite_engine: Engine, sqlite_url: str, settings: Settings, leaf: bool
) -> None:
    """Each time a skipping run reads messages, another connection that will not wait takes
    the write lock and writes: the run's lease transaction is committed before any read."""
    recap = Recap(settings, sqlite_engine)
    cid = recap.new("reader", model=MODEL)
    other = recap.new("writer", model=MODEL)
    last = 0
    for turn in range(20):
        last = recap.add(cid, _user(f"turn {turn}"))
    path = sqlite_url.removeprefix("sqlite:///")
    writes: list[str] = []

    def write_now(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if "messages" not in statement or not statement.lstrip().upper().startswith(
            ("SELECT", "WITH")
        ):
            return
        writer = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            writer.execute("BEGIN IMMEDIATE")  # fails at once while anyone holds the lock
            writer.execute("UPDATE conversations SET dirty = dirty WHERE id = ?", (other,))
            writer.execute("COMMIT")
            writes.append(statement)
        finally:
            writer.close()

    event.listen(sqlite_engine, "before_cursor_execute", write_now)
    try:
        result = compress_now(sqlite_engine, settings, cid, last if leaf else None)
    finally:
        event.remove(sqlite_engine, "before_cursor_execute", write_now)
    assert result["action"] == "skipped", result
    assert writes, "the run read no message"
