"""The Agents SDK's own ``SQLAlchemySession`` tests, against ``RecapSession``.

Adapted from the OpenAI Agents SDK's test suite: github.com/openai/openai-agents-python,
``tests/extensions/memory/test_sqlalchemy_session.py``,
commit 7f7a44f8dc0650296bd5ab6c745c9bcbaa6ac3b7 (the newest snapshot available here, between
releases 0.22 and 0.24; the ``Session`` protocol and ``SessionSettings`` it tests are unchanged
in the pinned 0.24). MIT licence, Copyright (c) 2025 OpenAI.

Adapted only where the session is made: each ``SQLiteSession``/``SQLAlchemySession`` is a
``RecapSession`` on a Recap database (``tests/support/agents_sessions.make_session``),
``SQLAlchemySession``'s ``engine`` is the database it names and its disposal ``close()``; the
tests run under anyio's pytest plugin (``pytest.mark.anyio``) instead of pytest-asyncio.
Left out, each because it inspects the peer's own storage rather than the ``Session`` contract:
- ``test_sqlalchemy_session_defaults_to_escaped_non_ascii_storage,
  ..._can_store_non_ascii_without_escaping``: the JSON text in SQLAlchemySession's table
- ``test_sqlite_fallback_reserves_writer_before_tail_claim,
  test_pop_item_supports_unknown_delete_rowcount,
  test_pop_item_retries_returning_claim_lost_to_concurrent_delete,
  test_mutation_cancellation_waits_for_transaction_exit``: SQLAlchemySession's statements
  intercepted on its engine
- ``test_pop_item_skips_corrupt_most_recent, test_get_items_limit_skips_corrupt_newest_rows,
  test_pop_item_returns_none_after_dropping_only_corrupt_rows``: invalid JSON rows written into its
  table
- ``test_add_items_waits_for_transient_sqlite_write_lock,
  test_add_items_cancelled_waiter_does_not_strand_table_init_lock,
  test_create_tables_false_does_not_allocate_shared_init_lock``: its engine's write lock and
  table-creation lock
- ``test_get_items_same_timestamp_consistent_order, test_pop_item_same_timestamp_returns_latest,
  test_get_items_orders_by_id_for_ties``: its ``created_at`` column rewritten (Recap orders by id
  alone)
- ``test_engine_property_from_url, ..._from_external_engine, ..._is_read_only,
  test_sqlite_configuration_registry_releases_collected_engines, ..._does_not_grow_unbounded``: its
  ``engine`` property and engine registry
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

agents = pytest.importorskip("agents", reason="the openai-agents extra is not installed")

from agents import Agent, Runner, TResponseInputItem  # noqa: E402
from agents.testing import ScriptedModel  # noqa: E402

from tests.support.agents_sessions import (  # noqa: E402
    CURRENT,
    Databases,
    get_text_message,
    make_session,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def databases(tmp_path: Path) -> Iterator[Databases]:
    """The test's Recap databases, made on first use and closed after it."""
    made = Databases(tmp_path / "recap")
    CURRENT.append(made)
    try:
        yield made
    finally:
        CURRENT.remove(made)
        made.close()


# Mark all tests in this file as anyio (asyncio)
pytestmark = pytest.mark.anyio

# Use in-memory SQLite for tests
DB_URL = "sqlite+aiosqlite:///:memory:"


@pytest.fixture
def agent() -> Agent:
    """Fixture for a basic agent with a scripted model."""
    return Agent(name="test", model=ScriptedModel())


async def test_sqlalchemy_session_direct_ops(agent: Agent):
    """Test direct database operations of SQLAlchemySession."""
    session_id = "direct_ops_test"
    session = make_session(session_id, url=DB_URL)

    # 1. Add items
    items: list[TResponseInputItem] = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there!"},
    ]
    await session.add_items(items)

    # 2. Get items and verify
    retrieved = await session.get_items()
    assert len(retrieved) == 2
    assert retrieved[0].get("content") == "Hello"
    assert retrieved[1].get("content") == "Hi there!"

    # 3. Pop item
    popped = await session.pop_item()
    assert popped is not None
    assert popped.get("content") == "Hi there!"
    retrieved_after_pop = await session.get_items()
    assert len(retrieved_after_pop) == 1
    assert retrieved_after_pop[0].get("content") == "Hello"

    # 4. Clear session
    await session.clear_session()
    retrieved_after_clear = await session.get_items()
    assert len(retrieved_after_clear) == 0


async def test_runner_integration(agent: Agent):
    """Test that SQLAlchemySession works correctly with the agent Runner."""
    session_id = "runner_integration_test"
    session = make_session(session_id, url=DB_URL)

    # First turn
    assert isinstance(agent.model, ScriptedModel)
    agent.model.enqueue([get_text_message("San Francisco")])
    result1 = await Runner.run(
        agent,
        "What city is the Golden Gate Bridge in?",
        session=session,
    )
    assert result1.final_output == "San Francisco"

    # Second turn
    agent.model.enqueue([get_text_message("California")])
    result2 = await Runner.run(agent, "What state is it in?", session=session)
    assert result2.final_output == "California"

    # Verify history was passed to the model on the second turn
    last_input = agent.model.calls[-1].input
    assert len(last_input) > 1
    assert any("Golden Gate Bridge" in str(item.get("content", "")) for item in last_input)


async def test_session_isolation(agent: Agent):
    """Test that different session IDs result in isolated conversation histories."""
    session_id_1 = "session_1"
    session1 = make_session(session_id_1, url=DB_URL)

    session_id_2 = "session_2"
    session2 = make_session(session_id_2, url=DB_URL)

    # Interact with session 1
    assert isinstance(agent.model, ScriptedModel)
    agent.model.enqueue([get_text_message("I like cats.")])
    await Runner.run(agent, "I like cats.", session=session1)

    # Interact with session 2
    agent.model.enqueue([get_text_message("I like dogs.")])
    await Runner.run(agent, "I like dogs.", session=session2)

    # Go back to session 1 and check its memory
    agent.model.enqueue([get_text_message("You said you like cats.")])
    result = await Runner.run(agent, "What animal did I say I like?", session=session1)
    assert "cats" in result.final_output.lower()
    assert "dogs" not in result.final_output.lower()


async def test_get_items_with_limit(agent: Agent):
    """Test the limit parameter in get_items."""
    session_id = "limit_test"
    session = make_session(session_id, url=DB_URL)

    items: list[TResponseInputItem] = [
        {"role": "user", "content": "1"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "3"},
        {"role": "assistant", "content": "4"},
    ]
    await session.add_items(items)

    # Get last 2 items
    latest_2 = await session.get_items(limit=2)
    assert len(latest_2) == 2
    assert latest_2[0].get("content") == "3"
    assert latest_2[1].get("content") == "4"

    # Get all items
    all_items = await session.get_items()
    assert len(all_items) == 4

    # Get more than available
    more_than_all = await session.get_items(limit=10)
    assert len(more_than_all) == 4


async def test_pop_from_empty_session():
    """Test that pop_item returns None on an empty session."""
    session = make_session("empty_session", url=DB_URL)
    popped = await session.pop_item()
    assert popped is None


async def test_concurrent_pop_item_returns_each_row_once(tmp_path):
    """Concurrent atomic DELETE claims must return each stored row at most once."""
    engine = f"sqlite+aiosqlite:///{tmp_path / 'concurrent_pop.db'}"
    writer = make_session("concurrent_pop", engine=engine)
    other = make_session("concurrent_pop", engine=engine)
    await writer.add_items(
        [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "second"},
        ]
    )

    tasks = [asyncio.create_task(session.pop_item()) for session in (writer, other)]
    try:
        popped = await asyncio.wait_for(asyncio.gather(*tasks), timeout=2)
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        pass  # the database is the test's, closed after it

    contents = {cast(dict[str, Any], item)["content"] for item in popped if item is not None}
    assert contents == {"first", "second"}


async def test_get_items_limit_returns_fewer_when_history_exhausted():
    """Window expansion stops at the end of history instead of looping."""
    session = make_session("limit_exhausted", url=DB_URL)

    await session.add_items([{"role": "user", "content": "only valid"}])

    retrieved = await session.get_items(limit=5)
    assert [item.get("content") for item in retrieved] == ["only valid"]


async def test_add_empty_items_list():
    """Test that adding an empty list of items is a no-op."""
    session_id = "add_empty_test"
    session = make_session(session_id, url=DB_URL)

    initial_items = await session.get_items()
    assert len(initial_items) == 0

    await session.add_items([])

    items_after_add = await session.get_items()
    assert len(items_after_add) == 0


async def test_add_items_concurrent_first_access_with_create_tables(tmp_path):
    """Concurrent first writes should not race table creation or drop items."""
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'concurrent_first_access.db'}"
    session = make_session(
        "concurrent_first_access",
        url=db_url,
    )
    submitted = [f"msg-{i}" for i in range(25)]

    async def worker(content: str) -> None:
        await session.add_items([{"role": "user", "content": content}])

    results = await asyncio.gather(
        *(worker(content) for content in submitted),
        return_exceptions=True,
    )

    assert [result for result in results if isinstance(result, Exception)] == []

    stored = await session.get_items()
    assert len(stored) == len(submitted)
    stored_contents: list[str] = []
    for item in stored:
        content = item.get("content")
        assert isinstance(content, str)
        stored_contents.append(content)
    assert sorted(stored_contents) == sorted(submitted)


async def test_add_items_concurrent_first_write_after_tables_exist(tmp_path):
    """Concurrent first writes should not race parent session creation."""
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'concurrent_first_write.db'}"
    setup_session = make_session(
        "concurrent_first_write",
        url=db_url,
    )
    await setup_session.get_items()

    session = make_session(
        "concurrent_first_write",
        url=db_url,
    )
    submitted = [f"msg-{i}" for i in range(25)]

    async def worker(content: str) -> None:
        await session.add_items([{"role": "user", "content": content}])

    results = await asyncio.gather(
        *(worker(content) for content in submitted),
        return_exceptions=True,
    )

    assert [result for result in results if isinstance(result, Exception)] == []

    stored = await session.get_items()
    assert len(stored) == len(submitted)
    stored_contents: list[str] = []
    for item in stored:
        content = item.get("content")
        assert isinstance(content, str)
        stored_contents.append(content)
    assert sorted(stored_contents) == sorted(submitted)


async def test_add_items_concurrent_first_access_across_sessions_with_shared_engine(tmp_path):
    """Concurrent first writes should not race table creation across session instances."""
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'concurrent_shared_engine.db'}"
    engine = db_url
    try:
        session_a = make_session("shared_engine_a", engine=engine)
        session_b = make_session("shared_engine_b", engine=engine)

        results = await asyncio.gather(
            session_a.add_items([{"role": "user", "content": "one"}]),
            session_b.add_items([{"role": "user", "content": "two"}]),
            return_exceptions=True,
        )

        assert [result for result in results if isinstance(result, Exception)] == []

        stored_a = await session_a.get_items()
        assert len(stored_a) == 1
        assert stored_a[0].get("content") == "one"

        stored_b = await session_b.get_items()
        assert len(stored_b) == 1
        assert stored_b[0].get("content") == "two"
    finally:
        pass  # the database is the test's, closed after it


async def test_add_items_concurrent_first_access_across_from_url_sessions(tmp_path):
    """Concurrent first writes should not race table creation across from_url sessions."""
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'concurrent_from_url.db'}"
    session_a = make_session("from_url_a", url=db_url)
    session_b = make_session("from_url_b", url=db_url)
    try:
        results = await asyncio.gather(
            session_a.add_items([{"role": "user", "content": "one"}]),
            session_b.add_items([{"role": "user", "content": "two"}]),
            return_exceptions=True,
        )

        assert [result for result in results if isinstance(result, Exception)] == []

        stored_a = await session_a.get_items()
        assert len(stored_a) == 1
        assert stored_a[0].get("content") == "one"

        stored_b = await session_b.get_items()
        assert len(stored_b) == 1
        assert stored_b[0].get("content") == "two"
    finally:
        session_a.close()
        session_b.close()


async def test_add_items_concurrent_first_access_across_from_url_sessions_cross_loop(tmp_path):
    """Concurrent first writes should not race or hang across event loops."""
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'concurrent_from_url_cross_loop.db'}"
    barrier = threading.Barrier(2)
    results: list[tuple[str, str, Any]] = []
    results_lock = threading.Lock()

    def worker(session_id: str, content: str) -> None:
        async def run() -> tuple[str, Any]:
            session = make_session(session_id, url=db_url)
            barrier.wait()
            try:
                await asyncio.wait_for(
                    session.add_items([{"role": "user", "content": content}]),
                    timeout=5,
                )
                stored = await session.get_items()
                return ("ok", stored)
            finally:
                session.close()

        try:
            status, payload = asyncio.run(run())
        except Exception as exc:
            status, payload = type(exc).__name__, str(exc)

        with results_lock:
            results.append((session_id, status, payload))

    threads = [
        threading.Thread(target=worker, args=("from_url_cross_loop_a", "one")),
        threading.Thread(target=worker, args=("from_url_cross_loop_b", "two")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        await asyncio.to_thread(thread.join)

    assert len(results) == 2
    assert [status for _, status, _ in results] == ["ok", "ok"]

    stored_by_session = {
        session_id: cast(list[TResponseInputItem], payload) for session_id, _, payload in results
    }
    assert stored_by_session["from_url_cross_loop_a"][0].get("content") == "one"
    assert stored_by_session["from_url_cross_loop_b"][0].get("content") == "two"


async def test_add_items_concurrent_first_access_with_shared_session_cross_loop(tmp_path):
    """A shared session instance should not hang when used from two event loops."""
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'shared_session_cross_loop.db'}"
    session = make_session(
        "shared_session_cross_loop",
        url=db_url,
    )
    barrier = threading.Barrier(2)
    results: list[tuple[str, str]] = []
    results_lock = threading.Lock()

    def worker(content: str) -> None:
        async def run() -> None:
            barrier.wait()
            await asyncio.wait_for(
                session.add_items([{"role": "user", "content": content}]),
                timeout=5,
            )

        try:
            asyncio.run(run())
            status = "ok"
        except Exception as exc:
            status = type(exc).__name__

        with results_lock:
            results.append((content, status))

    threads = [
        threading.Thread(target=worker, args=("one",)),
        threading.Thread(target=worker, args=("two",)),
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            await asyncio.to_thread(thread.join)

        assert sorted(results) == [("one", "ok"), ("two", "ok")]

        stored = await session.get_items()
        stored_contents: list[str] = []
        for item in stored:
            content = item.get("content")
            assert isinstance(content, str)
            stored_contents.append(content)
        assert sorted(stored_contents) == ["one", "two"]
    finally:
        session.close()


async def test_session_settings_default():
    """Test that session_settings defaults to empty SessionSettings."""
    from agents.memory import SessionSettings

    session = make_session("default_settings_test", url=DB_URL)

    # Should have default SessionSettings
    assert isinstance(session.session_settings, SessionSettings)
    assert session.session_settings.limit is None


@pytest.mark.parametrize("use_dictionary", [False, True], ids=["class", "dictionary"])
async def test_session_settings_from_url(use_dictionary: bool):
    """Test passing session_settings via from_url."""
    from agents.memory import SessionSettings

    session = make_session(
        "from_url_settings_test",
        url=DB_URL,
        session_settings={"limit": 5} if use_dictionary else SessionSettings(limit=5),
    )

    assert isinstance(session.session_settings, SessionSettings)
    assert session.session_settings.limit == 5


async def test_get_items_uses_session_settings_limit():
    """Test that get_items uses session_settings.limit as default."""
    from agents.memory import SessionSettings

    session = make_session(
        "uses_settings_limit_test",
        url=DB_URL,
        session_settings=SessionSettings(limit=3),
    )

    # Add 5 items
    items: list[TResponseInputItem] = [
        {"role": "user", "content": f"Message {i}"} for i in range(5)
    ]
    await session.add_items(items)

    # get_items() with no limit should use session_settings.limit=3
    retrieved = await session.get_items()
    assert len(retrieved) == 3
    # Should get the last 3 items
    assert retrieved[0].get("content") == "Message 2"
    assert retrieved[1].get("content") == "Message 3"
    assert retrieved[2].get("content") == "Message 4"


async def test_get_items_explicit_limit_overrides_session_settings():
    """Test that explicit limit parameter overrides session_settings."""
    from agents.memory import SessionSettings

    session = make_session(
        "explicit_override_test",
        url=DB_URL,
        session_settings=SessionSettings(limit=5),
    )

    # Add 10 items
    items: list[TResponseInputItem] = [
        {"role": "user", "content": f"Message {i}"} for i in range(10)
    ]
    await session.add_items(items)

    # Explicit limit=2 should override session_settings.limit=5
    retrieved = await session.get_items(limit=2)
    assert len(retrieved) == 2
    assert retrieved[0].get("content") == "Message 8"
    assert retrieved[1].get("content") == "Message 9"


async def test_session_settings_resolve():
    """Test SessionSettings.resolve() method."""
    from agents.memory import SessionSettings

    base = SessionSettings(limit=100)
    override = SessionSettings(limit=50)

    final = base.resolve(override)

    assert final.limit == 50  # Override wins
    assert base.limit == 100  # Original unchanged

    # Resolving with None returns self
    final_none = base.resolve(None)
    assert final_none.limit == 100


async def test_runner_with_session_settings_override(agent: Agent):
    """Test that RunConfig can override session's default settings."""
    from agents import RunConfig
    from agents.memory import SessionSettings

    # Session with default limit=100
    session = make_session(
        "runner_override_test",
        url=DB_URL,
        session_settings=SessionSettings(limit=100),
    )

    # Add some history
    items: list[TResponseInputItem] = [{"role": "user", "content": f"Turn {i}"} for i in range(10)]
    await session.add_items(items)

    # Use RunConfig to override limit to 2
    assert isinstance(agent.model, ScriptedModel)
    agent.model.enqueue([get_text_message("Got it")])

    await Runner.run(
        agent,
        "New question",
        session=session,
        run_config=RunConfig(
            session_settings=SessionSettings(limit=2)  # Override to 2
        ),
    )

    # Verify the agent received only the last 2 history items + new question
    last_input = agent.model.calls[-1].input
    # Filter out the new "New question" input
    history_items = [item for item in last_input if item.get("content") != "New question"]
    # Should have 2 history items (last two from the 10 we added)
    assert len(history_items) == 2
