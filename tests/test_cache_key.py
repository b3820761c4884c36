"""What a conversation costs over its life, on the host API: OpenAI's caching hints that
``assemble`` hands back (``prompt_cache_key`` per conversation and branch, the retention
setting), passed through the real ``openai`` client to the stand-in model, and the cache reads
and writes ``record_usage`` stores, from which ``stats`` reports the conversation's hit rate.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from pydantic import ValidationError
from sqlalchemy import text

from recap.core.aio import AsyncRecap
from recap.core.client import Recap
from recap.core.errors import InputError
from recap.core.settings import Settings
from recap.core.storage.db import make_engine
from recap.core.storage.migrate import alembic_config, current_revision, upgrade
from recap.core.storage.models import utcnow
from recap.core.storage.reads import Tree
from recap.core.values.assembly import prompt_cache_key
from tests.support.llm_server import LLMServer

FUZZ_SEEDS = range(12)
KEY_SHAPE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI accepts as a prompt_cache_key


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def reply(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


@pytest.fixture
def recap(tmp_path: Path) -> Recap:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'c.db'}", output_dir=tmp_path / "o")
    return Recap(settings, create_schema=True)


@pytest.fixture(scope="module")
def llm() -> Iterator[LLMServer]:
    server = LLMServer().start()
    yield server
    server.stop()


def key_of(recap: Recap, cid: str, leaf: int | None = None) -> str | None:
    return recap.assemble(cid, leaf=leaf).prompt_cache_key


# --- the key ------------------------------------------------------------------------------------


def test_the_key_is_stable_per_conversation_and_differs_between_conversations(
    recap: Recap,
) -> None:
    """Every request of a conversation carries one key, turn after turn; another
    conversation's differs; the key never shows the conversation id."""
    first, other = recap.new("tenant-a:conv-1"), recap.new("tenant-b:conv-1")
    recap.add(first, user("hello"))
    key = key_of(recap, first)
    assert key is not None and KEY_SHAPE.match(key) and "conv-1" not in key
    for turn in range(3):
        recap.add(first, reply(f"answer {turn}"))
        recap.add(first, user(f"question {turn}"))
        assert key_of(recap, first) == key
    recap.add(other, user("hello"))
    assert key_of(recap, other) not in (None, key)
    assert recap.assemble(first).cache_params() == {"prompt_cache_key": key}


def test_each_branch_keeps_a_key_of_its_own(recap: Recap) -> None:
    """An edit starts a branch: its requests carry a key of their own, kept as it grows; the
    main line's key is unchanged by it."""
    cid = recap.new()
    m1 = recap.add(cid, user("one"))
    m2 = recap.add(cid, reply("two"))
    m3 = recap.add(cid, user("three"))
    main = key_of(recap, cid, m3)
    edited = recap.add(cid, user("three, edited"), parent_id=m2)
    branch = key_of(recap, cid, edited)
    assert branch not in (None, main)
    grown = recap.add(cid, reply("four"), parent_id=edited)
    assert key_of(recap, cid, grown) == branch
    other = recap.add(cid, user("one, edited"), parent_id=m1)
    assert key_of(recap, cid, other) not in (main, branch)
    assert key_of(recap, cid, m3) == main  # the main line is as before
    assert key_of(recap, cid, m2) == main


def branch_root_by_walk(ids: list[int], parents: list[int | None], path: list[int]) -> int:
    """The branch's first message, spelled out: the newest message of the path that has an
    older sibling, else the root."""
    for at in range(len(path) - 1, 0, -1):
        siblings = [mid for mid, parent in zip(ids, parents, strict=True) if parent == path[at - 1]]
        if min(siblings) != path[at]:
            return path[at]
    return path[0]


@pytest.mark.parametrize("seed", FUZZ_SEEDS)
def test_random_trees_give_each_branch_one_stable_root(seed: int) -> None:
    """Random trees: ``Tree.branch_root`` is the walk's answer for every leaf, and messages
    added anywhere later never change it for a path that existed before."""
    rng = random.Random(seed)
    ids: list[int] = [1]
    parents: list[int | None] = [None]
    before: dict[int, int] = {}
    for size in range(2, 80):
        ids.append(size)
        parents.append(rng.choice(ids[:-1]) if rng.random() < 0.3 else size - 1)
        tree = Tree(ids, parents, [1] * len(ids))
        for leaf in rng.sample(ids, min(len(ids), 6)):
            path = tree.path("fuzz", leaf)
            root = tree.branch_root(path)
            assert root == branch_root_by_walk(ids, parents, path)
            assert before.setdefault(leaf, root) == root  # stable as the tree grows
    assert Tree([], [], []).branch_root([]) is None


@pytest.mark.parametrize("seed", FUZZ_SEEDS)
def test_random_ids_give_distinct_keys_that_hide_them(seed: int) -> None:
    """Any conversation id (of any script and length) and root: a key OpenAI accepts, that
    does not contain the id, and distinct for distinct pairs."""
    rng = random.Random(seed)
    alphabet = "abcXYZ019-_:/ éж漢🙂"
    seen: dict[str, tuple[str, int]] = {}
    for _ in range(200):
        cid = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 255)))
        root = rng.randint(1, 2**63 - 1)
        key = prompt_cache_key(cid, root)
        assert KEY_SHAPE.match(key) and (len(cid) < 6 or cid not in key)
        assert prompt_cache_key(cid, root) == key
        assert seen.setdefault(key, (cid, root)) == (cid, root)


def test_retention_is_a_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """RECAP_PROMPT_CACHE_RETENTION: unset sends none; set, every request carries it; a value
    OpenAI does not take is refused when the settings load."""
    monkeypatch.setenv("RECAP_PROMPT_CACHE_RETENTION", "24h")
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'r.db'}")
    assert settings.prompt_cache_retention == "24h"
    recap = Recap(settings, create_schema=True)
    cid = recap.new()
    recap.add(cid, user("hi"))
    built = recap.assemble(cid)
    assert built.prompt_cache_retention == "24h"
    assert built.cache_params() == {
        "prompt_cache_key": built.prompt_cache_key,
        "prompt_cache_retention": "24h",
    }
    monkeypatch.setenv("RECAP_PROMPT_CACHE_RETENTION", "forever")
    with pytest.raises(ValidationError):
        Settings()
    monkeypatch.delenv("RECAP_PROMPT_CACHE_RETENTION")
    assert Settings().prompt_cache_retention is None


def test_the_host_passes_the_hints_to_the_openai_client(recap: Recap, llm: LLMServer) -> None:
    """``**request.cache_params()`` in the real openai client: the model gets the key."""
    cid = recap.new()
    recap.add(cid, user("hello"))
    built = recap.assemble(cid)
    client = openai.OpenAI(base_url=llm.url, api_key="sk-test", max_retries=0)
    before = len(llm.requests)
    client.chat.completions.create(  # type: ignore[call-overload]
        model="stand-in", messages=built.messages, **built.cache_params()
    )
    assert llm.requests[before].body["prompt_cache_key"] == built.prompt_cache_key


# --- the recorded cost --------------------------------------------------------------------------


def test_stats_reports_the_cache_hit_rate_of_the_recorded_readings(recap: Recap) -> None:
    """``record_usage`` stores cached and cache-write tokens; ``stats`` adds the conversation's
    readings up: cached over input. A call without them still works (0)."""
    cid = recap.new()
    recap.add(cid, user("hello"))
    fresh = recap.stats(cid)
    assert fresh.cache_hit_rate is None and fresh.recorded_input_tokens == 0
    recap.assemble(cid)
    recap.record_usage(cid, prompt_tokens=1_000, cache_write_tokens=800)
    recap.add(cid, reply("hi"))
    recap.add(cid, user("more"))
    recap.assemble(cid)
    recap.record_usage(cid, prompt_tokens=1_200, cached_tokens=800, completion_tokens=9)
    recap.record_usage(cid, prompt_tokens=1_300)  # as hosts called it before: no cache figures
    stats = recap.stats(cid)
    assert (stats.recorded_input_tokens, stats.cached_tokens, stats.cache_write_tokens) == (
        3_500,
        800,
        800,
    )
    assert stats.cache_hit_rate == round(800 / 3_500, 4)
    assert stats.as_dict()["cache_hit_rate"] == stats.cache_hit_rate
    with pytest.raises(InputError):
        recap.record_usage(cid, prompt_tokens=10, cache_write_tokens=-1)
    assert recap.stats(cid).recorded_input_tokens == 3_500  # nothing stored


def test_async_record_usage_takes_cache_writes(recap: Recap) -> None:
    """``AsyncRecap.record_usage`` takes the same keywords."""

    async def run() -> None:
        arecap = AsyncRecap(recap)
        try:
            await check(arecap)
        finally:
            arecap.close()

    async def check(arecap: AsyncRecap) -> None:
        cid = await arecap.new()
        await arecap.add(cid, user("hello"))
        await arecap.assemble(cid)
        await arecap.record_usage(cid, prompt_tokens=100, cached_tokens=60, cache_write_tokens=30)
        stats = await arecap.stats(cid)
        assert (stats.cached_tokens, stats.cache_write_tokens, stats.cache_hit_rate) == (
            60,
            30,
            0.6,
        )

    asyncio.run(run())


def test_the_migration_keeps_old_readings_at_no_cache_writes(db_url: str) -> None:
    """From the revision before 0014 with a reading stored: the reading counts no cache
    writes, a new one stores them, ``stats`` adds both up; down again, the column goes."""
    from alembic import command
    from alembic.script import ScriptDirectory

    engine = make_engine(db_url)
    config = alembic_config(engine)
    before = ScriptDirectory.from_config(config).get_revision("0014").down_revision
    assert isinstance(before, str)
    upgrade(engine, before)
    now = utcnow()
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO conversations "
                "(id, model, created_at, last_activity_at, dirty, incarnation) "
                "VALUES ('c', 'gpt-4o-mini', :now, :now, false, 'i')"
            ),
            {"now": now},
        )
        connection.execute(
            text(
                "INSERT INTO usage (conversation_id, estimated_tokens, prompt_tokens, "
                "completion_tokens, cached_tokens, created_at) "
                "VALUES ('c', 90, 100, 5, 40, :now)"
            ),
            {"now": now},
        )
    upgrade(engine)
    recap = Recap(Settings(database_url=db_url), engine)
    recap.record_usage("c", prompt_tokens=300, cached_tokens=60, cache_write_tokens=200)
    stats = recap.stats("c")
    assert (stats.recorded_input_tokens, stats.cached_tokens, stats.cache_write_tokens) == (
        400,
        100,
        200,
    )
    assert stats.cache_hit_rate == 0.25
    command.downgrade(config, before)
    assert current_revision(engine) == before
    with engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM usage")).scalar_one() == 2
    upgrade(engine)
    engine.dispose()
