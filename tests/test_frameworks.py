"""The framework adapters driving the real packages against the stand-in model server, with a
real ``recap worker`` (file broker, offline summarizer) compressing in the background.

Each test talks 24 turns at a 6,000-token window, two of them with a tool call, and waits after
each turn for the worker's run it enqueued. Then: the store holds every message; the worker has
summarized; the model's last requests carry the summary and fewer messages than the store holds;
each tool call went to the model with its result under the same call id. The OpenAI Agents SDK
runs on a chat-completions model and on a Responses model (with ``run_sync``, ``run`` and
streamed runs); LangChain with a checkpointer (sync) and without one (async); Pydantic AI as a
capability.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from recap.core.client import Recap
from tests.support.frameworks_stack import (
    FrameworkStack,
    carries_summary,
    host_on,
    start_stack,
    tool_call_reply,
    user_text,
)

agents = pytest.importorskip("agents", reason="the openai-agents extra is not installed")
pytest.importorskip("langchain.agents", reason="the langchain extra is not installed")
pytest.importorskip("langchain_openai", reason="langchain-openai is not installed")
pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")

WINDOW = 6_000
TURNS = 24
TOOL_TURNS = (4, 15)  # turns whose model answer calls the tool first (15 streamed on the SDK)
SYSTEM = "You are a support agent. Answer briefly."


def tool_output(order_id: str) -> str:
    return f"order {order_id}: shipped"


def call_id(turn: int) -> str:
    return f"call_t{turn}"


def tool_reply(turn: int) -> Any:
    return tool_call_reply(call_id(turn), "lookup", json.dumps({"order_id": f"A{turn}"}))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrameworkStack]:
    running = start_stack(tmp_path_factory.mktemp("frameworks"))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def recap(stack: FrameworkStack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Recap]:
    """A host on the stack: its settings in the environment too (``compress_later`` reads the
    broker folder from there)."""
    with host_on(stack, monkeypatch) as host:
        yield host


def assert_compressed_and_complete(
    stack: FrameworkStack, recap: Recap, cid: str, first_request: int
) -> None:
    """Every message stored in order, a summary written, the last requests carrying it with
    fewer messages than the store holds, and each tool call sent back with its result."""
    stored = recap.export(cid).messages
    users = [m["content"] for m in stored if m["role"] == "user"]
    assert users == [user_text(turn) for turn in range(TURNS)]
    assert len(stored) == 2 * TURNS + 2 * len(TOOL_TURNS)  # user, reply; call and result
    assert recap.summaries(cid), "the worker wrote no summary"
    requests = stack.server.requests[first_request:]
    assert carries_summary(requests[-1]), "the last request carries no summary"
    assert len(requests[-1].messages) < len(stored)
    for turn in TOOL_TURNS:
        results = [m for m in stored if m["role"] == "tool" and m["tool_call_id"] == call_id(turn)]
        assert [m["content"] for m in results] == [tool_output(f"A{turn}")]
        calls = [m for m in stored if m["role"] == "assistant" and m.get("tool_calls")]
        assert any(c["tool_calls"][0]["id"] == call_id(turn) for c in calls)
        answered = [r for r in requests if tool_output(f"A{turn}") in json.dumps(r.messages)]
        assert answered, f"no request carried the result of {call_id(turn)}"
        sent = json.dumps(answered[0].messages)
        assert call_id(turn) in sent  # the call and its result, under the stored id


# --- the OpenAI Agents SDK -----------------------------------------------------------------------


def _agents_models(stack: FrameworkStack, kind: str) -> Any:
    from openai import AsyncOpenAI

    def make() -> Any:
        client = AsyncOpenAI(base_url=stack.server.url, api_key="test-key", max_retries=0)
        if kind == "responses":
            return agents.OpenAIResponsesModel(model="stand-in", openai_client=client)
        return agents.OpenAIChatCompletionsModel(model="stand-in", openai_client=client)

    return make


@pytest.mark.parametrize("kind", ["chat", "responses"])
def test_openai_agents_session(stack: FrameworkStack, recap: Recap, kind: str) -> None:
    """``Runner.run_sync`` for the first turns, then ``Runner.run``, every fifth turn streamed
    (``Runner.run_streamed``), one of them with a tool call."""
    from agents import Agent, Runner, function_tool, set_tracing_disabled

    from recap.integrations.openai_agents import RecapSession

    set_tracing_disabled(True)

    @function_tool
    def lookup(order_id: str) -> str:
        """Look up an order by its id."""
        return tool_output(order_id)

    make = _agents_models(stack, kind)
    cid = f"agents-{kind}-{uuid.uuid4().hex[:8]}"
    session = RecapSession(cid, recap=recap, max_input_tokens=WINDOW)
    first = len(stack.server.requests)
    enqueued = 0

    def after(turn: int) -> None:
        nonlocal enqueued
        enqueued += 2 if turn in TOOL_TURNS else 1  # one run per model response
        stack.wait_runs(cid, enqueued)

    sync_agent = Agent(name="support", instructions=SYSTEM, model=make(), tools=[lookup])
    for turn in range(2):
        Runner.run_sync(sync_agent, user_text(turn), session=session)
        after(turn)

    async def talk() -> None:
        agent = Agent(name="support", instructions=SYSTEM, model=make(), tools=[lookup])
        for turn in range(2, TURNS):
            if turn in TOOL_TURNS:
                stack.server.script(tool_reply(turn))
            if turn % 5 == 0:
                streamed = Runner.run_streamed(agent, user_text(turn), session=session)
                async for _event in streamed.stream_events():
                    pass
                assert str(streamed.final_output).startswith("reply")
            else:
                result = await Runner.run(agent, user_text(turn), session=session)
                assert str(result.final_output).startswith("reply")
            await asyncio.to_thread(after, turn)

    asyncio.run(talk())
    assert_compressed_and_complete(stack, recap, cid, first)
    assert any(r.body.get("stream") for r in stack.server.requests[first:])
    items = asyncio.run(session.get_items())
    assert items[0]["content"].startswith("Summary of the earlier")  # type: ignore[typeddict-item]


# --- LangChain v1 agents -------------------------------------------------------------------------


def _langchain_agent(stack: FrameworkStack, recap: Recap, checkpointer: Any) -> Any:
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from recap.integrations.langchain import RecapMiddleware

    @tool
    def lookup(order_id: str) -> str:
        """Look up an order by its id."""
        return tool_output(order_id)

    model = ChatOpenAI(model="stand-in", base_url=stack.server.url, api_key="test-key")
    middleware = RecapMiddleware(recap=recap, max_input_tokens=WINDOW)
    return create_agent(
        model, [lookup], system_prompt=SYSTEM, middleware=[middleware], checkpointer=checkpointer
    )


def test_langchain_middleware_with_a_checkpointer(stack: FrameworkStack, recap: Recap) -> None:
    """``invoke`` on a thread kept by a checkpointer: the state keeps the full history, the
    model sees Recap's assembly."""
    from langgraph.checkpoint.memory import InMemorySaver

    agent = _langchain_agent(stack, recap, InMemorySaver())
    cid = f"lc-{uuid.uuid4().hex[:8]}"
    config = {"configurable": {"thread_id": cid}}
    first = len(stack.server.requests)
    for turn in range(TURNS):
        if turn in TOOL_TURNS:
            stack.server.script(tool_reply(turn))
        state = agent.invoke({"messages": [("user", user_text(turn))]}, config)
        stack.wait_runs(cid, turn + 1)  # one run per turn
    assert len(state["messages"]) == 2 * TURNS + 2 * len(TOOL_TURNS)  # the state left intact
    assert_compressed_and_complete(stack, recap, cid, first)


def test_langchain_middleware_without_a_checkpointer(stack: FrameworkStack, recap: Recap) -> None:
    """``ainvoke`` (every fifth turn ``astream``) with only the new message each turn: Recap
    holds the history."""
    agent = _langchain_agent(stack, recap, None)
    cid = f"lc-async-{uuid.uuid4().hex[:8]}"
    config = {"configurable": {"thread_id": cid}}
    first = len(stack.server.requests)

    async def talk() -> None:
        for turn in range(TURNS):
            if turn in TOOL_TURNS:
                stack.server.script(tool_reply(turn))
            turn_input = {"messages": [("user", user_text(turn))]}
            if turn % 5 == 0:  # streamed now and then
                async for _chunk in agent.astream(turn_input, config, stream_mode="messages"):
                    pass
            else:
                await agent.ainvoke(turn_input, config)
            await asyncio.to_thread(stack.wait_runs, cid, turn + 1)

    asyncio.run(talk())
    assert_compressed_and_complete(stack, recap, cid, first)
    # without a checkpointer, only Recap's history reached the model: turn 1 saw turn 0
    assert user_text(0) in stack.server.requests[first + 1].text


# --- Pydantic AI ---------------------------------------------------------------------------------


def test_pydantic_ai_capability(stack: FrameworkStack, recap: Recap) -> None:
    """``agent.run`` and, every sixth turn, ``agent.run_stream``."""
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from recap.integrations.pydantic_ai import RecapHistory

    cid = f"pai-{uuid.uuid4().hex[:8]}"
    history = RecapHistory(cid, recap=recap, max_input_tokens=WINDOW)
    model = OpenAIChatModel(
        "stand-in", provider=OpenAIProvider(base_url=stack.server.url, api_key="test-key")
    )
    agent = Agent(model, system_prompt=SYSTEM, capabilities=[history])

    @agent.tool_plain
    def lookup(order_id: str) -> str:
        """Look up an order by its id."""
        return tool_output(order_id)

    first = len(stack.server.requests)

    async def talk() -> None:
        for turn in range(TURNS):
            if turn in TOOL_TURNS:
                stack.server.script(tool_reply(turn))
            if turn % 6 == 0:  # a streamed run now and then
                async with agent.run_stream(user_text(turn)) as streamed:
                    assert (await streamed.get_output()).startswith("reply")
            else:
                result = await agent.run(user_text(turn))
                assert result.output.startswith("reply")
            await asyncio.to_thread(stack.wait_runs, cid, turn + 1)

    asyncio.run(talk())
    assert_compressed_and_complete(stack, recap, cid, first)


def test_import_recap_needs_no_celery(tmp_path: Path) -> None:
    """``import recap`` loads neither Celery nor litellm; ``compress_later`` loads Celery when
    first used."""
    import subprocess
    import sys

    code = (
        "import sys, recap\n"
        "print(sorted(m for m in ('celery', 'kombu', 'litellm') if m in sys.modules))\n"
        "recap.compress_later\n"
        "print('celery' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.split() == ["[]", "True"], done.stdout + done.stderr
