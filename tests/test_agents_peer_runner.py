"""The Agents SDK's own runner-with-session tests (``Runner.run``, ``run_sync``, ``run_streamed``),
against ``RecapSession``.

Adapted from the OpenAI Agents SDK's test suite: github.com/openai/openai-agents-python,
``tests/memory/test_session.py``, ``tests/memory/test_session_limit.py``,
commit 7f7a44f8dc0650296bd5ab6c745c9bcbaa6ac3b7 (the newest snapshot available here, between
releases 0.22 and 0.24; the ``Session`` protocol and ``SessionSettings`` it tests are unchanged
in the pinned 0.24). MIT licence, Copyright (c) 2025 OpenAI.

Adapted only where the session is made: each ``SQLiteSession``/``SQLAlchemySession`` is a
``RecapSession`` on a Recap database (``tests/support/agents_sessions.make_session``),
``SQLAlchemySession``'s ``engine`` is the database it names and its disposal ``close()``; the
tests run under anyio's pytest plugin (``pytest.mark.anyio``) instead of pytest-asyncio.
The ``SQLiteSession`` cases are in ``tests/test_agents_peer_sqlite.py``, with those left out.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

agents = pytest.importorskip("agents", reason="the openai-agents extra is not installed")

from agents import Agent, RunConfig, Runner, SessionSettings, TResponseInputItem  # noqa: E402
from agents.testing import ScriptedModel  # noqa: E402

from tests.support.agents_sessions import (  # noqa: E402
    CURRENT,
    Databases,
    get_text_message,
    make_session,
    run_agent_async,
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


@pytest.mark.parametrize("runner_method", ["run", "run_sync", "run_streamed"])
@pytest.mark.anyio
async def test_session_memory_basic_functionality_parametrized(runner_method):
    """Test basic session memory functionality with SQLite backend across all runner methods."""
    with tempfile.TemporaryDirectory() as temp_dir:
        db_path = Path(temp_dir) / "test_memory.db"
        session_id = "test_session_123"
        session = make_session(session_id, db_path)

        model = ScriptedModel()
        agent = Agent(name="test", model=model)

        # First turn
        model.enqueue([get_text_message("San Francisco")])
        result1 = await run_agent_async(
            runner_method,
            agent,
            "What city is the Golden Gate Bridge in?",
            session=session,
        )
        assert result1.final_output == "San Francisco"

        # Second turn - should have conversation history
        model.enqueue([get_text_message("California")])
        result2 = await run_agent_async(
            runner_method,
            agent,
            "What state is it in?",
            session=session,
        )
        assert result2.final_output == "California"

        # Verify that the input to the second turn includes the previous conversation
        # The model should have received the full conversation history
        last_input = model.calls[-1].input
        assert len(last_input) > 1  # Should have more than just the current message

        session.close()


@pytest.mark.parametrize("runner_method", ["run", "run_sync", "run_streamed"])
@pytest.mark.anyio
async def test_session_memory_with_explicit_instance_parametrized(runner_method):
    """Test session memory with an explicit SQLiteSession instance across all runner methods."""
    with tempfile.TemporaryDirectory() as temp_dir:
        db_path = Path(temp_dir) / "test_memory.db"
        session_id = "test_session_456"
        session = make_session(session_id, db_path)

        model = ScriptedModel()
        agent = Agent(name="test", model=model)

        # First turn
        model.enqueue([get_text_message("Hello")])
        result1 = await run_agent_async(runner_method, agent, "Hi there", session=session)
        assert result1.final_output == "Hello"

        # Second turn
        model.enqueue([get_text_message("I remember you said hi")])
        result2 = await run_agent_async(
            runner_method,
            agent,
            "Do you remember what I said?",
            session=session,
        )
        assert result2.final_output == "I remember you said hi"

        session.close()


@pytest.mark.parametrize("runner_method", ["run", "run_sync", "run_streamed"])
@pytest.mark.anyio
async def test_session_memory_disabled_parametrized(runner_method):
    """Test that session memory is disabled when session=None across all runner methods."""
    model = ScriptedModel()
    agent = Agent(name="test", model=model)

    # First turn (no session parameters = disabled)
    model.enqueue([get_text_message("Hello")])
    result1 = await run_agent_async(runner_method, agent, "Hi there")
    assert result1.final_output == "Hello"

    # Second turn - should NOT have conversation history
    model.enqueue([get_text_message("I don't remember")])
    result2 = await run_agent_async(runner_method, agent, "Do you remember what I said?")
    assert result2.final_output == "I don't remember"

    # Verify that the input to the second turn is just the current message
    last_input = model.calls[-1].input
    assert len(last_input) == 1  # Should only have the current message


@pytest.mark.parametrize("runner_method", ["run", "run_sync", "run_streamed"])
@pytest.mark.anyio
async def test_session_memory_different_sessions_parametrized(runner_method):
    """Test that different session IDs maintain separate conversation histories across all runner
    methods."""
    with tempfile.TemporaryDirectory() as temp_dir:
        db_path = Path(temp_dir) / "test_memory.db"

        model = ScriptedModel()
        agent = Agent(name="test", model=model)

        # Session 1
        session_id_1 = "session_1"
        session_1 = make_session(session_id_1, db_path)

        model.enqueue([get_text_message("I like cats")])
        result1 = await run_agent_async(runner_method, agent, "I like cats", session=session_1)
        assert result1.final_output == "I like cats"

        # Session 2 - different session
        session_id_2 = "session_2"
        session_2 = make_session(session_id_2, db_path)

        model.enqueue([get_text_message("I like dogs")])
        result2 = await run_agent_async(runner_method, agent, "I like dogs", session=session_2)
        assert result2.final_output == "I like dogs"

        # Back to Session 1 - should remember cats, not dogs
        model.enqueue([get_text_message("Yes, you mentioned cats")])
        result3 = await run_agent_async(
            runner_method,
            agent,
            "What did I say I like?",
            session=session_1,
        )
        assert result3.final_output == "Yes, you mentioned cats"

        session_1.close()
        session_2.close()


@pytest.mark.parametrize("runner_method", ["run", "run_sync", "run_streamed"])
@pytest.mark.anyio
async def test_session_memory_appends_list_input_by_default(runner_method):
    """Test that list inputs are appended to session history when no callback is provided."""
    with tempfile.TemporaryDirectory() as temp_dir:
        db_path = Path(temp_dir) / "test_validation.db"
        session_id = "test_validation_parametrized"
        session = make_session(session_id, db_path)

        model = ScriptedModel()
        agent = Agent(name="test", model=model)

        initial_history: list[TResponseInputItem] = [
            {"role": "user", "content": "Earlier message"},
            {"role": "assistant", "content": "Saved reply"},
        ]
        await session.add_items(initial_history)

        list_input = [{"role": "user", "content": "Test message"}]

        model.enqueue([get_text_message("This should run")])
        await run_agent_async(runner_method, agent, list_input, session=session)

        assert model.calls[-1].input == initial_history + list_input

        session.close()


@pytest.mark.parametrize("runner_method", ["run", "run_sync", "run_streamed"])
@pytest.mark.anyio
async def test_session_callback_prepared_input(runner_method):
    """Test if the user passes a list of items and want to append them."""
    with tempfile.TemporaryDirectory() as temp_dir:
        db_path = Path(temp_dir) / "test_memory.db"

        model = ScriptedModel()
        agent = Agent(name="test", model=model)

        # Session
        session_id = "session_1"
        session = make_session(session_id, db_path)

        # Add first messages manually
        initial_history: list[TResponseInputItem] = [
            {"role": "user", "content": "Hello there."},
            {"role": "assistant", "content": "Hi, I'm here to assist you."},
        ]
        try:
            await session.add_items(initial_history)

            def filter_assistant_messages(history, new_input):
                # Only include user messages from history
                return [item for item in history if item["role"] == "user"] + new_input

            new_turn_input = [{"role": "user", "content": "What your name?"}]
            model.enqueue([get_text_message("I'm gpt-4o")])

            # Run the agent with the callable
            await run_agent_async(
                runner_method,
                agent,
                new_turn_input,
                session=session,
                run_config=RunConfig(session_input_callback=filter_assistant_messages),
            )

            expected_model_input = [
                initial_history[0],  # From history
                new_turn_input[0],  # New input
            ]

            assert len(model.calls[-1].input) == 2
            assert model.calls[-1].input == expected_model_input
        finally:
            session.close()


@pytest.mark.parametrize("runner_method", ["run", "run_sync", "run_streamed"])
@pytest.mark.anyio
async def test_session_callback_repeating_history_does_not_grow_session(runner_method):
    with tempfile.TemporaryDirectory() as temp_dir:
        db_path = Path(temp_dir) / "test_memory.db"
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        session = make_session("session_repeat", db_path)

        def repeat_first(history, new_input):
            if not history:
                return new_input
            return history + [history[0]] + new_input  # noqa: RUF005  # as upstream

        try:
            for turn in range(3):
                model.enqueue([get_text_message(f"assistant {turn}")])
                await run_agent_async(
                    runner_method,
                    agent,
                    f"user {turn}",
                    session=session,
                    run_config=RunConfig(session_input_callback=repeat_first),
                )

            stored = await session.get_items()
            user_messages = [item for item in stored if item.get("role") == "user"]
            assert [item.get("content") for item in user_messages] == [
                "user 0",
                "user 1",
                "user 2",
            ]
            assert len(stored) == 6
        finally:
            session.close()


@pytest.mark.anyio
async def test_session_add_items_exception_propagates_in_streamed():
    """Test that exceptions from session.add_items are properly propagated
    in run_streamed instead of causing the stream to hang forever.
    Regression test for https://github.com/openai/openai-agents-python/issues/2130
    """
    session = make_session("test_exception_session")

    async def _failing_add_items(_items):
        raise RuntimeError("Simulated session.add_items failure")

    session.add_items = _failing_add_items  # type: ignore[method-assign]

    model = ScriptedModel()
    agent = Agent(name="test", model=model)
    model.enqueue([get_text_message("This should not be reached")])

    result = Runner.run_streamed(agent, "Hello", session=session)

    async def consume_stream():
        async for _event in result.stream_events():
            pass

    with pytest.raises(RuntimeError, match="Simulated session.add_items failure"):  # noqa: RUF043
        # Timeout ensures test fails fast instead of hanging forever if bug regresses
        await asyncio.wait_for(consume_stream(), timeout=5.0)

    session.close()


@pytest.mark.anyio
async def test_runner_with_session_settings_override():
    """Test that RunConfig can override session's default settings."""
    from agents.memory import SessionSettings

    with tempfile.TemporaryDirectory() as temp_dir:
        db_path = Path(temp_dir) / "test_runner_override.db"

        # Session with default limit=100
        session = make_session(
            "runner_override_test", db_path, session_settings=SessionSettings(limit=100)
        )

        # Add some history
        items: list[TResponseInputItem] = [
            {"role": "user", "content": f"Turn {i}"} for i in range(10)
        ]
        await session.add_items(items)

        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        model.enqueue([get_text_message("Got it")])

        await Runner.run(
            agent,
            "New question",
            session=session,
            run_config=RunConfig(
                session_settings=SessionSettings(limit=2)  # Override to 2
            ),
        )

        # Verify the agent received only the last 2 history items + new question
        last_input = model.calls[-1].input
        # Filter out the new "New question" input
        history_items = [item for item in last_input if item.get("content") != "New question"]
        # Should have 2 history items (last two from the 10 we added)
        assert len(history_items) == 2

        session.close()


@pytest.mark.parametrize("runner_method", ["run", "run_sync", "run_streamed"])
@pytest.mark.anyio
async def test_session_limit_parameter(runner_method):
    """Test that session_limit parameter correctly limits conversation history
    retrieved from session across all Runner methods."""
    with tempfile.TemporaryDirectory() as temp_dir:
        db_path = Path(temp_dir) / "test_limit.db"
        session_id = "limit_test"
        session = make_session(session_id, db_path)

        model = ScriptedModel()
        agent = Agent(name="test", model=model)

        # Build up a longer conversation history
        model.enqueue([get_text_message("Reply 1")])
        await run_agent_async(runner_method, agent, "Message 1", session=session)

        model.enqueue([get_text_message("Reply 2")])
        await run_agent_async(runner_method, agent, "Message 2", session=session)

        model.enqueue([get_text_message("Reply 3")])
        await run_agent_async(runner_method, agent, "Message 3", session=session)

        # Verify we have 6 items in total (3 user + 3 assistant)
        all_items = await session.get_items()
        assert len(all_items) == 6

        # Test session_limit via RunConfig - should only get last 2 history items + new input
        model.enqueue([get_text_message("Reply 4")])
        await run_agent_async(
            runner_method,
            agent,
            "Message 4",
            session=session,
            run_config=RunConfig(session_settings=SessionSettings(limit=2)),
        )

        # Verify model received limited history
        last_input = model.calls[-1].input
        # Should have: 2 history items + 1 new message = 3 total
        assert len(last_input) == 3
        # First item should be "Message 3" (not Message 1 or 2)
        assert last_input[0].get("content") == "Message 3"
        # Assistant message has content as a list
        assert last_input[1].get("content")[0]["text"] == "Reply 3"
        assert last_input[2].get("content") == "Message 4"

        session.close()


@pytest.mark.parametrize("runner_method", ["run", "run_sync", "run_streamed"])
@pytest.mark.anyio
async def test_session_limit_drops_unmatched_history_function_call_output(runner_method):
    """A limit boundary must not pass an output whose matching call was excluded."""
    with tempfile.TemporaryDirectory() as temp_dir:
        session = make_session("limit_tool_pair", Path(temp_dir) / "test_limit_tool_pair.db")
        history = cast(
            list[TResponseInputItem],
            [
                {"role": "user", "content": "What is the weather?"},
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "get_weather",
                    "arguments": "{}",
                },
                {
                    "type": "function_call_output",
                    "call_id": "call_1",
                    "output": "sunny",
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [
                        {
                            "type": "output_text",
                            "text": "It is sunny.",
                            "annotations": [],
                        }
                    ],
                },
            ],
        )
        await session.add_items(history)

        assert await session.get_items(limit=2) == history[-2:]

        model = ScriptedModel()
        model.enqueue([get_text_message("Tomorrow is sunny too.")])
        agent = Agent(name="test", model=model)

        await run_agent_async(
            runner_method,
            agent,
            "What about tomorrow?",
            session=session,
            run_config=RunConfig(session_settings=SessionSettings(limit=2)),
        )

        assert model.calls[-1].input == [
            history[-1],
            {"role": "user", "content": "What about tomorrow?"},
        ]
        session.close()


@pytest.mark.parametrize("runner_method", ["run", "run_sync", "run_streamed"])
@pytest.mark.anyio
async def test_session_limit_zero(runner_method):
    """Test that session_limit=0 provides no history, only new message."""
    with tempfile.TemporaryDirectory() as temp_dir:
        db_path = Path(temp_dir) / "test_limit_zero.db"
        session_id = "limit_zero_test"
        session = make_session(session_id, db_path)

        model = ScriptedModel()
        agent = Agent(name="test", model=model)

        # Build conversation history
        model.enqueue([get_text_message("Reply 1")])
        await run_agent_async(runner_method, agent, "Message 1", session=session)

        model.enqueue([get_text_message("Reply 2")])
        await run_agent_async(runner_method, agent, "Message 2", session=session)

        # Test with limit=0 - should get NO history, just new message
        model.enqueue([get_text_message("Reply 3")])
        await run_agent_async(
            runner_method,
            agent,
            "Message 3",
            session=session,
            run_config=RunConfig(session_settings=SessionSettings(limit=0)),
        )

        # Verify model received only the new message
        last_input = model.calls[-1].input
        assert len(last_input) == 1
        assert last_input[0].get("content") == "Message 3"

        session.close()


@pytest.mark.parametrize("runner_method", ["run", "run_sync", "run_streamed"])
@pytest.mark.anyio
async def test_session_limit_none_gets_all_history(runner_method):
    """Test that session_limit=None retrieves entire history (default behavior)."""
    with tempfile.TemporaryDirectory() as temp_dir:
        db_path = Path(temp_dir) / "test_limit_none.db"
        session_id = "limit_none_test"
        session = make_session(session_id, db_path)

        model = ScriptedModel()
        agent = Agent(name="test", model=model)

        # Build longer conversation
        for i in range(1, 6):
            model.enqueue([get_text_message(f"Reply {i}")])
            await run_agent_async(runner_method, agent, f"Message {i}", session=session)

        # Verify 10 items in session (5 user + 5 assistant)
        all_items = await session.get_items()
        assert len(all_items) == 10

        # Test with session_limit=None (default) - should get all history
        model.enqueue([get_text_message("Reply 6")])
        await run_agent_async(
            runner_method,
            agent,
            "Message 6",
            session=session,
            run_config=RunConfig(session_settings=SessionSettings(limit=None)),
        )

        # Verify model received all history + new message
        last_input = model.calls[-1].input
        assert len(last_input) == 11  # 10 history + 1 new
        assert last_input[0].get("content") == "Message 1"
        assert last_input[-1].get("content") == "Message 6"

        session.close()


@pytest.mark.parametrize("runner_method", ["run", "run_sync", "run_streamed"])
@pytest.mark.anyio
async def test_session_limit_larger_than_history(runner_method):
    """Test that session_limit larger than history size returns all items."""
    with tempfile.TemporaryDirectory() as temp_dir:
        db_path = Path(temp_dir) / "test_limit_large.db"
        session_id = "limit_large_test"
        session = make_session(session_id, db_path)

        model = ScriptedModel()
        agent = Agent(name="test", model=model)

        # Build small conversation
        model.enqueue([get_text_message("Reply 1")])
        await run_agent_async(runner_method, agent, "Message 1", session=session)

        # Test with limit=100 (much larger than actual history)
        model.enqueue([get_text_message("Reply 2")])
        await run_agent_async(
            runner_method,
            agent,
            "Message 2",
            session=session,
            run_config=RunConfig(session_settings=SessionSettings(limit=100)),
        )

        # Verify model received all available history + new message
        last_input = model.calls[-1].input
        assert len(last_input) == 3  # 2 history + 1 new
        assert last_input[0].get("content") == "Message 1"
        # Assistant message has content as a list
        assert last_input[1].get("content")[0]["text"] == "Reply 1"
        assert last_input[2].get("content") == "Message 2"

        session.close()
