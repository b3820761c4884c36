"""The request read reused from the conversation's last one (``core.storage.reuse``, keyed on
``core.storage.versions.request_version``) against a fresh read, on seeded random histories:
turns, tool calls, forks, leaves anywhere, summaries, clearings, output reserves, provider
readings, model changes with their recounts (lazy and batched), requests that write back what
they learned, and the conversation deleted and made again. After every step the two must give
the same request, byte for byte, or the same error; and the reuse must have been used."""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import Engine, select

from recap.core import lifecycle, service
from recap.core.errors import BudgetError, RecapError
from recap.core.settings import Settings
from recap.core.storage import reads, recount
from recap.core.storage import reuse as reuses
from recap.core.storage.db import session_scope
from recap.core.storage.models import CLEARINGS, MESSAGES, SUMMARIES, Clearing, Summary, utcnow
from recap.core.storage.reuse import BranchReuse
from recap.core.storage.versions import request_version

SEEDS = 8  # random histories in the suite (python -m bench reuse runs more)
STEPS = 70  # steps of each
MODELS = ("gpt-4o", "gpt-4")  # o200k and cl100k: a change recounts every row
WINDOWS = (1_800, 4_000, 120_000)  # tight (history left out), middling, roomy
WORDS = ("alpha", "beta", "src/app.py", "pytest -q", "KeyError:", "the", "order", "4711")
STEP_KINDS = (
    ("turn", 30),  # a user message (and often the reply) after the leaf
    ("tools", 10),  # an assistant's tool calls and their results after the leaf
    ("fork", 6),  # a user message under an earlier message: an edit
    ("leaf", 6),  # the next request is for another stored message
    ("summary", 6),
    ("clear", 6),
    ("reserve", 4),  # the conversation's own output reserve set or dropped
    ("usage", 6),  # a provider reading (calibration)
    ("model", 3),  # another tokenizer: rows are recounted lazily, and in batches
    ("recount", 3),
    ("record", 10),  # a request that writes what it learned (profile, recounts, clearings)
    ("recreate", 1),  # the conversation deleted and made again under the same id
    ("pin", 4),  # a message pinned (sent verbatim, after the summary once it covers it)
    ("unpin", 3),  # a pinned message unpinned (its row deleted)
)


@dataclass
class History:
    """The random conversation as the test knows it."""

    cid: str
    window: int
    leaf: int | None = None
    ids: list[int] = field(default_factory=list)
    tools: list[int] = field(default_factory=list)  # tool results, to clear
    model: str = MODELS[0]


def _words(rng: random.Random, low: int = 1, high: int = 50) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def _add(engine: Engine, h: History, message: dict[str, Any], parent: int | None) -> int:
    mid = service.add_message(engine, h.cid, message, parent_id=parent)
    h.ids.append(mid)
    h.leaf = mid
    if message["role"] == "tool":
        h.tools.append(mid)
    return mid


def _step(engine: Engine, settings: Settings, h: History, rng: random.Random, n: int) -> None:
    kinds, weights = zip(*STEP_KINDS, strict=True)
    kind = rng.choices(kinds, weights)[0]
    if kind in ("turn", "fork") or not h.ids:
        parent = h.leaf if kind == "turn" or not h.ids else rng.choice(h.ids)
        _add(engine, h, {"role": "user", "content": f"u{n} " + _words(rng)}, parent)
        if rng.random() < 0.7:
            _add(engine, h, {"role": "assistant", "content": f"a{n} " + _words(rng)}, h.leaf)
    elif kind == "tools":
        calls = [
            {"id": f"c{n}_{k}", "type": "function",
             "function": {"name": "bash", "arguments": json.dumps({"n": n, "k": k})}}
            for k in range(rng.randint(1, 3))
        ]  # fmt: skip
        _add(engine, h, {"role": "assistant", "content": None, "tool_calls": calls}, h.leaf)
        for call in calls:
            result = {"role": "tool", "tool_call_id": call["id"], "content": _words(rng, 5, 200)}
            _add(engine, h, result, h.leaf)
    elif kind == "leaf":
        h.leaf = rng.choice(h.ids)
    elif kind == "summary":
        _summary(engine, h, rng)
    elif kind == "clear" and h.tools:
        _clear(engine, h, rng.choice(h.tools))
    elif kind == "reserve":
        service.set_output_reserve(engine, h.cid, rng.choice([None, 0, 200, 900]))
    elif kind == "usage":
        service.record_usage(engine, h.cid, prompt_tokens=rng.randint(200, 5_000), leaf=h.leaf)
    elif kind == "model":
        h.model = MODELS[1 - MODELS.index(h.model)]
        recount.set_model(engine, h.cid, h.model, max_input_tokens=h.window)
    elif kind == "recount":
        recount.recount_conversation(engine, h.cid, batch=rng.choice([7, 500]), max_batches=2)
    elif kind == "record":
        with contextlib.suppress(BudgetError):
            service.assemble(engine, h.cid, settings, leaf=h.leaf, reuse=BranchReuse())
    elif kind == "pin" and h.ids:
        with contextlib.suppress(RecapError):  # over the pin cap: refused, nothing pinned
            lifecycle.pin(engine, h.cid, rng.choice(h.ids), settings)
    elif kind == "unpin" and h.ids:
        lifecycle.unpin(engine, h.cid, rng.choice(h.ids), settings)
    elif kind == "recreate":
        lifecycle.delete(engine, h.cid, settings)
        service.new_conversation(engine, settings, h.cid, model=h.model, max_input_tokens=h.window)
        h.leaf, h.ids, h.tools = None, [], []


def _summary(engine: Engine, h: History, rng: random.Random) -> None:
    """A summary at a random message before the leaf (on the leaf's branch or another)."""
    if len(h.ids) < 3:
        return
    cutoff = rng.choice(h.ids[: len(h.ids) * 2 // 3])
    with session_scope(engine) as session:
        taken = session.connection().execute(
            select(SUMMARIES.c.cutoff_message_id).where(SUMMARIES.c.conversation_id == h.cid)
        )
        if cutoff in {row[0] for row in taken}:
            return
        session.add(
            Summary(
                conversation_id=h.cid, cutoff_message_id=cutoff,
                text=f"summary up to {cutoff}: " + _words(rng, 5, 40), tokens=rng.randint(8, 60),
                encoding="o200k_base", model="extractive", created_at=utcnow(),
            )
        )  # fmt: skip


def _clear(engine: Engine, h: History, mid: int) -> None:
    with session_scope(engine) as session:
        connection = session.connection()
        m = MESSAGES.c
        tokens = connection.execute(select(m.tokens).where(m.id == mid)).scalar()
        done = connection.execute(
            select(CLEARINGS.c.id).where(CLEARINGS.c.message_id == mid)
        ).first()
        if tokens is None or done is not None:
            return
        session.add(
            Clearing(
                conversation_id=h.cid, message_id=mid, reason="idle",
                tokens_reclaimed=max(0, int(tokens) - 30), created_at=utcnow(),
            )
        )  # fmt: skip


def _request(
    engine: Engine, settings: Settings, h: History, reuse: BranchReuse | None
) -> tuple[str, Any]:
    """The request as JSON text and as a value, or the error's class and text."""
    try:
        request = service.assemble(engine, h.cid, settings, leaf=h.leaf, record=False, reuse=reuse)
    except BudgetError as exc:
        return f"{type(exc).__name__}: {exc}", None
    return json.dumps(request.as_dict(), sort_keys=True), request


def _same_reads(engine: Engine, h: History, reuse: BranchReuse, budget: int | None) -> bool:
    """The read itself, value for value (row counts and their bases included)."""
    with session_scope(engine) as session:
        version = request_version(session.connection(), h.cid)
        reused = reuses.load_request_branch(session, h.cid, h.leaf, budget, version, reuse)
    with session_scope(engine) as session:
        fresh = reads.load_request_branch(session, h.cid, h.leaf, budget)
    return reused == fresh


def compare_history(
    engine: Engine, settings: Settings, seed: int, steps: int = STEPS
) -> tuple[list[str], BranchReuse]:
    """A seeded random history, the reused and the fresh request compared after each step:
    the steps where they differ (none is right), and the reuse used."""
    rng = random.Random(seed)
    h = History(cid=f"reuse-{seed}", window=rng.choice(WINDOWS))
    service.new_conversation(engine, settings, h.cid, model=h.model, max_input_tokens=h.window)
    reuse = BranchReuse()
    differences: list[str] = []
    for n in range(steps):
        _step(engine, settings, h, rng, n)
        if not h.ids:
            continue
        reused_text, reused = _request(engine, settings, h, reuse)
        fresh_text, fresh = _request(engine, settings, h, None)
        again = _request(engine, settings, h, reuse)[0]  # nothing changed: a reuse of a reuse
        if reused_text != fresh_text or reused != fresh or again != fresh_text:
            differences.append(f"seed {seed}, step {n}: the requests differ")
        if not _same_reads(engine, h, reuse, rng.choice([None, 300, 2_000])):
            differences.append(f"seed {seed}, step {n}: the reads differ")
    return differences, reuse


def _check_history(engine: Engine, settings: Settings, seed: int) -> None:
    differences, reuse = compare_history(engine, settings, seed)
    assert differences == []
    assert reuse.hits > reuse.misses > 0


@pytest.mark.parametrize("seed", range(SEEDS))
def test_reused_reads_give_the_fresh_request(
    sqlite_engine: Engine, settings: Settings, seed: int
) -> None:
    _check_history(sqlite_engine, settings, seed)


def test_reused_reads_give_the_fresh_request_on_every_database(
    engine: Engine, settings: Settings
) -> None:
    _check_history(engine, settings, 1000)


def test_a_turn_after_a_turn_reads_only_the_new_rows(
    sqlite_engine: Engine, settings: Settings
) -> None:
    """The common case: each request is the last one plus the reply and a new message."""
    cid = service.new_conversation(sqlite_engine, settings, "turns")
    reuse = BranchReuse()
    for n in range(6):
        service.add_message(sqlite_engine, cid, {"role": "user", "content": f"question {n}"})
        service.assemble(sqlite_engine, cid, settings, reuse=reuse)
        service.add_message(sqlite_engine, cid, {"role": "assistant", "content": f"answer {n}"})
    assert (reuse.misses, reuse.hits) == (1, 5)


def _version(engine: Engine, cid: str) -> Any:
    with session_scope(engine) as session:
        return request_version(session.connection(), cid)


def test_every_write_the_request_reads_changes_the_version(
    sqlite_engine: Engine, settings: Settings
) -> None:
    """Table-driven: each kind of write moves the version; a repeat of a request does not."""
    engine = sqlite_engine
    cid = service.new_conversation(engine, settings, "versions", model="gpt-4o")
    h = History(cid=cid, window=120_000)
    calls = [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]
    first = _add(engine, h, {"role": "user", "content": "look at src/app.py"}, None)
    _add(engine, h, {"role": "assistant", "content": None, "tool_calls": calls}, h.leaf)
    result = _add(engine, h, {"role": "tool", "tool_call_id": "c1", "content": "x " * 400}, h.leaf)
    rng = random.Random(7)

    def recounted() -> None:
        recount.set_model(engine, cid, "gpt-4")
        recount.recount_conversation(engine, cid)

    def recreated() -> None:
        lifecycle.delete(engine, cid, settings)
        service.new_conversation(engine, settings, cid)

    writes: list[tuple[str, Callable[[], object]]] = [
        ("message", lambda: _add(engine, h, {"role": "user", "content": "and now?"}, h.leaf)),
        ("edit", lambda: _add(engine, h, {"role": "user", "content": "edited"}, first)),
        ("summary", lambda: _summary(engine, h, rng)),
        ("clearing", lambda: _clear(engine, h, result)),
        ("recount", recounted),
        ("pin", lambda: lifecycle.pin(engine, cid, first, settings)),
        ("unpin", lambda: lifecycle.unpin(engine, cid, first, settings)),
        ("recreate", recreated),
    ]
    for name, write in writes:
        before = _version(engine, cid)
        service.assemble(engine, cid, settings, record=False)
        assert _version(engine, cid) == before, name  # a read changes nothing
        write()
        after = _version(engine, cid)
        assert after != before, name
        if name in ("message", "edit"):
            assert after.same_but_messages(before), name
        else:
            assert not after.same_but_messages(before) or after.messages != before.messages, name
