"""``RecapMiddleware``'s side of the loop, case by case, with ``create_agent`` and
``ChatOpenAI`` against the stand-in model server: the usage of each model call recorded (cached
tokens included), the call's ``max_tokens`` and tool schemas planned with, a context-length
error answered by compressing and sending a different request once, and the same request never
sent again when there is nothing to compress.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langchain.agents", reason="the langchain extra is not installed")
pytest.importorskip("langchain_openai", reason="langchain-openai is not installed")

from sqlalchemy import text

from recap.core.client import Recap
from tests.support.content_meter import ContentMeter
from tests.support.hosts import fresh_recap
from tests.support.llm_server import LLMServer, Reply

CID = "thread-1"
OVERFLOW = "context_length_exceeded"


@pytest.fixture
def recap(tmp_path: Path) -> Iterator[Recap]:
    with fresh_recap(tmp_path) as host:
        yield host


@pytest.fixture
def server() -> Iterator[LLMServer]:
    running = LLMServer(default=lambda body: "answer " + "word " * 150).start()
    try:
        yield running
    finally:
        running.stop()


def agent_on(server: LLMServer, recap: Recap, window: int, **model: Any) -> Any:
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from recap.integrations.langchain import RecapMiddleware

    @tool
    def lookup(key: str, region: str, detail: str) -> str:
        """Look an order up by its key; the region and the detail level narrow the search."""
        return key

    chat = ChatOpenAI(
        model="stand-in", base_url=server.url, api_key="test-key", max_retries=0, **model
    )
    middleware = RecapMiddleware(recap=recap, max_input_tokens=window, enqueue=False)
    return create_agent(chat, [lookup], system_prompt="Be brief. " * 30, middleware=[middleware])


def refusal(count: int, window: int) -> Reply:
    message = (
        f"This model's maximum context length is {window} tokens. However, your messages "
        f"resulted in {count} tokens. Please reduce the length of the messages."
    )
    return Reply(status=400, error=message, code=OVERFLOW)


def usage_rows(recap: Recap) -> list[tuple[int, int, int]]:
    with recap.engine.connect() as connection:
        query = text(
            "SELECT prompt_tokens, completion_tokens, cached_tokens FROM usage "
            "WHERE conversation_id = :c ORDER BY id"
        )
        return [(r[0], r[1], r[2]) for r in connection.execute(query, {"c": CID})]


def turn(agent: Any, message: str) -> Any:
    return agent.invoke({"messages": [("user", message)]}, {"configurable": {"thread_id": CID}})


def test_every_model_call_records_its_usage(server: LLMServer, recap: Recap) -> None:
    """One usage row per model call, the provider's own figures, cached tokens included."""
    server.meter = ContentMeter(window=50_000, seed=3)
    agent = agent_on(server, recap, 50_000)
    for n in range(3):
        turn(agent, f"question {n} " + "detail " * 40)
    rows = usage_rows(recap)
    assert [row[0] for row in rows] == server.meter.requests
    assert all(completion > 0 for _, completion, _ in rows)
    assert rows[-1][2] > 0  # the prefix the previous request sent was read from the cache
    assert recap.stats(CID).calibration != 1.0


def test_the_request_is_planned_with_its_fixed_parts(server: LLMServer, recap: Recap) -> None:
    """The system prompt and the tool schema are the fixed parts, ``max_tokens`` the output
    reserve."""
    agent = agent_on(server, recap, 8_000, max_tokens=700)
    turn(agent, "hello")
    stats = recap.stats(CID)
    assert stats.output_reserve == 700
    assert stats.fixed > 100
    assert server.requests[-1].body["tools"]


def test_a_context_overflow_compresses_and_retries_once(server: LLMServer, recap: Recap) -> None:
    """The provider refuses a request: the count it states is recorded, the conversation is
    compressed, and a different, smaller request goes out once; the turn succeeds."""
    agent = agent_on(server, recap, 4_000)
    for n in range(6):
        turn(agent, f"question {n} " + "detail " * 150)
    before = len(server.requests)
    server.script(refusal(4_400, 4_000))
    state = turn(agent, "the last question")
    assert state["messages"][-1].content.startswith("answer")
    refused, resent = server.requests[before:]
    assert len(resent.messages) < len(refused.messages)
    assert json.dumps(resent.messages) != json.dumps(refused.messages)
    assert recap.summaries(CID)
    assert 4_400 in [row[0] for row in usage_rows(recap)]


def test_the_same_request_is_never_sent_again(server: LLMServer, recap: Recap) -> None:
    """Nothing to compress: the provider's error goes on after one request."""
    agent = agent_on(server, recap, 4_000)
    server.script(refusal(300, 100))
    with pytest.raises(Exception, match="maximum context length"):
        turn(agent, "a question")
    assert len(server.requests) == 1
