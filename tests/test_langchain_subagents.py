"""A LangChain agent used as a tool of another (``sub.invoke`` inside an ``@tool``): both on
``RecapMiddleware``, with ``ChatOpenAI`` against the stand-in model server. The sub-agent's run
inherits the parent's ``thread_id``; its messages go to a conversation of its own, never into
the parent's, and the parent's next request carries them after the tool's result, between the
attachment's markers, once. Placement rules with plain configs are in the table below.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langchain.agents", reason="the langchain extra is not installed")
pytest.importorskip("langchain_openai", reason="langchain-openai is not installed")

from sqlalchemy import text

from recap.core.client import Recap
from recap.integrations import _subagents
from tests.support.hosts import fresh_recap
from tests.support.llm_server import LLMServer, Reply

THREAD = "lead-7"


@pytest.fixture
def recap(tmp_path: Path) -> Iterator[Recap]:
    with fresh_recap(tmp_path) as host:
        yield host


def _answer(body: dict[str, Any]) -> str:
    system = body["messages"][0]["content"] if body["messages"] else ""
    return ("found: the invoice is 41 EUR" if system.startswith("RESEARCH") else "done") + "."


@pytest.fixture
def server() -> Iterator[LLMServer]:
    running = LLMServer(default=_answer).start()
    try:
        yield running
    finally:
        running.stop()


def call(call_id: str, question: str) -> dict[str, Any]:
    arguments = json.dumps({"question": question})
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "research", "arguments": arguments},
    }


def agents(server: LLMServer, recap: Recap, *, sub_conversation: str | None = None) -> Any:
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.memory import InMemorySaver

    from recap.integrations.langchain import RecapMiddleware

    def chat() -> Any:
        return ChatOpenAI(model="stand-in", base_url=server.url, api_key="k", max_retries=0)

    def middleware(conversation_id: str | None = None) -> RecapMiddleware:
        return RecapMiddleware(
            recap=recap, conversation_id=conversation_id, max_input_tokens=16_000, enqueue=False
        )

    researcher = create_agent(
        chat(), [], system_prompt="RESEARCH the archive.", middleware=[middleware(sub_conversation)]
    )

    @tool
    def research(question: str) -> str:
        """Ask the researcher."""
        state = researcher.invoke({"messages": [("user", question)]})
        return str(state["messages"][-1].content)

    @tool
    async def aresearch(question: str) -> str:
        """Ask the researcher."""
        state = await researcher.ainvoke({"messages": [("user", question)]})
        return str(state["messages"][-1].content)

    aresearch.name = "research"
    return lambda asynchronous=False: create_agent(
        chat(),
        [aresearch if asynchronous else research],
        system_prompt="LEAD the work.",
        middleware=[middleware()],
        checkpointer=InMemorySaver(),
    )


def conversations(recap: Recap) -> dict[str, list[tuple[str, str | None]]]:
    with recap.engine.connect() as connection:
        rows = connection.execute(
            text("SELECT conversation_id, role, content FROM messages ORDER BY id")
        ).fetchall()
    found: dict[str, list[tuple[str, str | None]]] = {}
    for cid, role, content in rows:
        found.setdefault(cid, []).append((role, content))
    return found


def contents(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] if isinstance(m.get("content"), str) else "" for m in messages]


def test_a_sub_agents_messages_stay_out_of_the_parents_conversation(
    server: LLMServer, recap: Recap
) -> None:
    """The sub-agent's question and answer are stored in ``<thread>/tools:<task>``; the
    parent's conversation holds its own four messages and the attachment's markers."""
    server.script(Reply(text="", tool_calls=[call("c1", "what do we owe ACME?")]))
    lead = agents(server, recap)()
    lead.invoke({"messages": [("user", "settle ACME")]}, {"configurable": {"thread_id": THREAD}})
    stored = conversations(recap)
    subs = [cid for cid in stored if cid != THREAD]
    assert len(subs) == 1 and subs[0].startswith(f"{THREAD}/tools:")
    assert [c for _, c in stored[subs[0]]] == [
        "what do we owe ACME?",
        "found: the invoice is 41 EUR.",
    ]
    parent_text = [c or "" for _, c in stored[THREAD]]
    assert "what do we owe ACME?" not in parent_text  # the parent never holds the sub's turn
    assert [r for r, _ in stored[THREAD]][:3] == ["user", "assistant", "tool"]


def test_the_parents_next_request_carries_the_sub_agents_work_once(
    server: LLMServer, recap: Recap
) -> None:
    """After the tool's result, the parent's model call carries the sub-agent's messages
    between the markers; the turn after carries them once more, never twice."""
    server.script(Reply(text="", tool_calls=[call("c1", "what do we owe ACME?")]))
    lead = agents(server, recap)()
    config = {"configurable": {"thread_id": THREAD}}
    lead.invoke({"messages": [("user", "settle ACME")]}, config)
    after_tool = contents(server.requests[-1].messages)
    assert after_tool[0].startswith("LEAD")
    tool_at = next(i for i, m in enumerate(server.requests[-1].messages) if m["role"] == "tool")
    question_at = after_tool.index("what do we owe ACME?")
    assert question_at > tool_at
    assert after_tool[question_at - 1].startswith("[Attached")
    lead.invoke({"messages": [("user", "and now?")]}, config)
    later = contents(server.requests[-1].messages)
    assert later.count("what do we owe ACME?") == 1
    assert (
        later.count("found: the invoice is 41 EUR.") == 2
    )  # the tool's result and the sub's answer


def test_parallel_sub_agent_calls_are_conversations_of_their_own(
    server: LLMServer, recap: Recap
) -> None:
    """Two calls of the tool in one model answer: two sub-agent conversations, each attached."""
    server.script(Reply(text="", tool_calls=[call("c1", "owe ACME?"), call("c2", "owe Globex?")]))
    lead = agents(server, recap)()
    lead.invoke({"messages": [("user", "settle all")]}, {"configurable": {"thread_id": THREAD}})
    subs = sorted(cid for cid in conversations(recap) if cid != THREAD)
    assert len(subs) == 2
    sent = contents(server.requests[-1].messages)
    assert "owe ACME?" in sent and "owe Globex?" in sent
    assert sum(1 for c in sent if c.startswith("[Attached")) == 2


def test_a_sub_agent_with_a_conversation_of_its_own_is_attached_too(
    server: LLMServer, recap: Recap
) -> None:
    server.script(Reply(text="", tool_calls=[call("c1", "owe ACME?")]))
    lead = agents(server, recap, sub_conversation="researcher-7")()
    lead.invoke({"messages": [("user", "settle")]}, {"configurable": {"thread_id": THREAD}})
    assert set(conversations(recap)) == {THREAD, "researcher-7"}
    assert "owe ACME?" in contents(server.requests[-1].messages)


def test_the_same_holds_for_an_asynchronous_run(server: LLMServer, recap: Recap) -> None:
    server.script(Reply(text="", tool_calls=[call("c1", "owe ACME?")]))
    lead = agents(server, recap)(asynchronous=True)
    config = {"configurable": {"thread_id": THREAD}}
    asyncio.run(lead.ainvoke({"messages": [("user", "settle")]}, config))
    stored = conversations(recap)
    assert len(stored) == 2
    assert "owe ACME?" not in [c for _, c in stored[THREAD]]
    assert "owe ACME?" in contents(server.requests[-1].messages)


def test_an_agent_run_as_a_node_of_another_graph_keeps_the_threads_conversation(
    server: LLMServer, recap: Recap
) -> None:
    """Not inside a tool call: a ``create_agent`` graph used as a node of a ``StateGraph`` is
    the thread's conversation, as at the top level."""
    from langgraph.graph import START, MessagesState, StateGraph

    lead = agents(server, recap)()
    outer = StateGraph(MessagesState)
    outer.add_node("lead", lead)
    outer.add_edge(START, "lead")
    graph = outer.compile()
    graph.invoke({"messages": [("user", "hello")]}, {"configurable": {"thread_id": THREAD}})
    assert set(conversations(recap)) == {THREAD}


# --- placement with plain configs ----------------------------------------------------------------

PLACEMENTS = [
    # (the runs seen before, in order: (thread, namespace, fixed)), the run, its placement
    ([], ("t", "model:1", None), ("t", None)),
    ([], ("t", "", "fixed"), ("fixed", None)),
    ([], (None, "model:1", None), None),
    ([("t", "model:1", None)], ("t", "tools:9|model:2", None), ("t/tools:9", "t")),
    ([("t", "model:1", "lead")], ("t", "tools:9|model:2", None), ("lead/tools:9", "lead")),
    ([("t", "model:1", None)], ("t", "tools:9|model:2", "own"), ("own", "t")),
    ([("t", "model:1", None)], ("u", "tools:9|model:2", None), ("u", None)),  # another thread
    ([("t", "model:1", None)], ("t", "node:3|model:2", None), ("t", None)),  # not a tool call
    (
        [("t", "model:1", None), ("t", "tools:9|model:2", None)],
        ("t", "tools:9|tools:4|model:5", None),
        ("t/tools:9/tools:4", "t/tools:9"),
    ),
    ([("t", "outer:0|model:1", None)], ("t", "outer:0|tools:9|model:2", None), ("t/tools:9", "t")),
]


@pytest.mark.parametrize(("before", "run", "expected"), PLACEMENTS)
def test_placement(before: list[Any], run: Any, expected: Any) -> None:
    _subagents._runs.clear()
    _subagents._pending.clear()

    def configurable(thread: str | None, namespace: str) -> dict[str, Any]:
        return {"thread_id": thread, "checkpoint_ns": namespace}

    for thread, namespace, fixed in before:
        _subagents.place(configurable(thread, namespace), fixed)
    placed = _subagents.place(configurable(run[0], run[1]), run[2])
    if expected is None:
        assert placed is None
        return
    assert placed is not None
    assert (placed.conversation_id, placed.parent) == expected
    if expected[1] is not None:
        assert placed.conversation_id in _subagents.waiting(expected[1])
        _subagents.attached(expected[1], placed.conversation_id)
        assert _subagents.waiting(expected[1]) == []
