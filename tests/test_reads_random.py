"""The hot-path read (``core.storage.reads``: ids and parents first, then full rows newest first,
only as far back as the budget can reach) against the whole stored branch, on seeded random trees in
SQLite: forks at any message, leaves anywhere, summaries on some branches and not others,
cleared results, windows from tight to roomy. The two must give the same request, byte for byte,
or the same budget error."""

from __future__ import annotations

import random
from typing import Any

import pytest
from sqlalchemy import Engine, select

from recap.core import service
from recap.core.errors import NotFoundError
from recap.core.settings import Settings
from recap.core.storage.db import session_scope
from recap.core.storage.models import MESSAGES, Clearing, Summary, utcnow
from tests.test_assembly_data import check_partial_read

TREES = 12
MESSAGES_PER_TREE = 120
LEAVES_PER_TREE = 4
WINDOWS = (1_000, 3_000, 100_000)
FORK_SHARE = 0.06  # messages hung under an earlier one (an edit, a regenerate)
FORK_REACH = 12  # how far back an edit reaches, in messages
WORDS = ("alpha", "beta", "src/app.py", "pytest -q", "KeyError:", "the", "order", "4711")


def _content(rng: random.Random, mid_hint: int) -> str:
    return f"n{mid_hint} " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60)))


def _grow(
    engine: Engine, cid: str, rng: random.Random, forks: float = FORK_SHARE
) -> dict[int, set[str]]:
    """A random tree: each message hangs under the newest one or, now and then, under one of
    the last few (an edit, a regenerate). Returns each message's calls still open on its path."""
    open_at: dict[int, set[str]] = {}
    latest: int | None = None
    for n in range(MESSAGES_PER_TREE):
        parent = latest
        if open_at and rng.random() < forks:
            parent = rng.choice(sorted(open_at)[-FORK_REACH:])
        pending = set(open_at.get(parent, set())) if parent is not None else set()
        message: dict[str, Any]
        roll = rng.random()
        if pending and roll < 0.6:
            answered = rng.choice(sorted(pending))
            pending.discard(answered)
            message = {"role": "tool", "tool_call_id": answered, "name": "bash",
                       "content": _content(rng, n)}  # fmt: skip
        elif roll < 0.75:
            ids = [f"c{n}_{k}" for k in range(rng.randint(1, 2))]
            pending |= set(ids)
            calls = [
                {
                    "id": i,
                    "type": "function",
                    "function": {"name": "bash", "arguments": f'{{"n": {n}}}'},
                }
                for i in ids
            ]
            message = {"role": "assistant", "content": None, "tool_calls": calls}  # fmt: skip
        elif roll < 0.9:
            message = {"role": "user", "content": _content(rng, n)}
        else:
            message = {"role": "assistant", "content": _content(rng, n)}
        latest = service.add_message(engine, cid, message, parent_id=parent)
        open_at[latest] = pending
    return open_at


def _decorate(engine: Engine, cid: str, rng: random.Random) -> None:
    """Summaries at two random cutoffs in the oldest third, and a third of the results cleared."""
    with session_scope(engine) as session:
        m = MESSAGES.c  # every message of every branch, not one branch
        rows = session.connection().execute(
            select(m.id, m.role, m.tokens).where(m.conversation_id == cid).order_by(m.id)
        )
        messages = {row.id: row for row in rows}
        for cutoff in rng.sample(sorted(messages)[: len(messages) // 3], 2):
            session.add(
                Summary(
                    conversation_id=cid, cutoff_message_id=cutoff, text=f"summary up to {cutoff}",
                    tokens=12, encoding="o200k_base", model="extractive", created_at=utcnow(),
                )
            )  # fmt: skip
        for message in messages.values():
            if message.role == "tool" and rng.random() < 0.33:
                session.add(
                    Clearing(
                        conversation_id=cid, message_id=message.id, reason="idle",
                        tokens_reclaimed=max(0, message.tokens - 30), created_at=utcnow(),
                    )
                )  # fmt: skip


@pytest.mark.parametrize("seed", range(TREES))
def test_partial_reads_match_the_whole_branch_on_random_trees(
    sqlite_engine: Engine, settings: Settings, seed: int
) -> None:
    """Any leaf of a random tree, any window: the same request or the same error both ways."""
    _check_tree(sqlite_engine, settings, seed, FORK_SHARE)


@pytest.mark.parametrize(("seed", "forks"), [(100, 0.0), (101, FORK_SHARE)])
def test_partial_reads_match_on_every_database(
    engine: Engine, settings: Settings, seed: int, forks: float
) -> None:
    """The ids and parents come as one aggregate per database (SQLite's json_group_array,
    PostgreSQL's json_agg): a chain without forks (read without a walk, any leaf on it) and a
    tree with forks give the same requests as the whole branch on both."""
    _check_tree(engine, settings, seed, forks)


def _check_tree(engine: Engine, settings: Settings, seed: int, forks: float) -> None:
    rng = random.Random(seed)
    cid = service.new_conversation(engine, settings, f"tree-{seed}")
    open_at = _grow(engine, cid, rng, forks)
    _decorate(engine, cid, rng)
    leaves = [max(open_at), *rng.sample(sorted(open_at), LEAVES_PER_TREE - 1)]
    for leaf in leaves:
        for window in WINDOWS:
            check_partial_read(engine, settings, cid, window, leaf)
    with pytest.raises(NotFoundError):
        service.assemble(engine, cid, settings, leaf=max(open_at) + 10_000)
