"""Recap's framework adapters against each framework's own compaction, over the same 60-turn
conversation at an 8,000-token window, with the same summary model answering in 1 s.

**LangChain.** ``create_agent`` with one tool, an in-memory checkpointer and ``ChatOpenAI`` on
the stand-in model server (answering at once), with ``SummarizationMiddleware`` against the
same agent with ``RecapMiddleware`` and a ``recap worker``. The peer runs with its defaults (keep
the last 20 messages, LangChain's approximate token counter) and the one setting it needs to
summarize at all (its default trigger is none): ``trigger=("tokens", 6400)``, 80 % of the
window, the fraction its documentation shows.

**OpenAI Agents SDK.** An ``Agent`` with the same tool on a Responses model (the stand-in
server), with ``OpenAIResponsesCompactionSession`` over an in-memory ``SQLiteSession`` (its
defaults: compact once 10 items have accumulated) against ``RecapSession``. The compaction
session calls ``responses.compact`` on the summary server, which answers as OpenAI documents
it (every user message, then one compaction item holding the summary). It runs in ``input``
mode, the history sent with the call: in its default ``auto`` mode it would send only a
``previous_response_id``, whose server-side history no offline server holds.

Recap runs with its defaults (``max_input_tokens=8000``), its worker summarizing in the
background; the benchmark waits for the worker's runs between turns, outside the timed turn, as
a user's think time would. The conversation is the tau-bench airline dialogues' own user and
agent texts, every ninth turn calling the tool.

Figures, for each framework: the p99 turn time (wall clock) over the turns at which a summary
happens (the peer's summary call inside the turn; the turn whose enqueued run summarized, for
Recap), Recap's over the peer's; and the requests the agent model received that were over the
window, counted by tiktoken (``o200k_base``: messages, instructions and tool schemas; a
compaction item by its summary text), for each side.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import Figure
from bench.data import load

TURNS = 60
WINDOW = 8_000
PEER_TRIGGER_TOKENS = 6_400  # 80 % of the window
SUMMARY_SECONDS = 1.0  # the summary model's answer time, for both sides
TOOL_EVERY = 9  # every ninth turn's first answer calls the tool
ENCODING = "o200k_base"  # gpt-4o-mini's, the default model's
USER_CHARS = 300  # about 75 tokens of real user text per turn
REPLY_CHARS = 500  # about 120 tokens of real agent text per reply
SYSTEM = "You are an airline support agent. Answer briefly and look bookings up when asked."
P99_BOUND = "<= 0.2"
COMPACT_MODEL = "gpt-4.1"  # the compaction session's default model name (it accepts OpenAI's)


def dialogue_texts() -> tuple[list[str], list[str]]:
    """The user and agent texts of the tau-bench dialogues, cut into turns of about the sizes
    above (consecutive texts joined)."""
    users: list[str] = []
    replies: list[str] = []
    pending = {"user": "", "assistant": ""}
    for record in load("tau_bench_airline.jsonl"):
        for message in record["messages"]:
            role, content = message.get("role"), message.get("content")
            if role not in pending or not isinstance(content, str) or not content.strip():
                continue
            pending[role] = (pending[role] + " " + content.strip()).strip()
            limit = USER_CHARS if role == "user" else REPLY_CHARS
            if len(pending[role]) >= limit:
                (users if role == "user" else replies).append(pending[role])
                pending[role] = ""
    return users, replies


@dataclass
class Side:
    """One agent's run: each turn's time and whether a summary happened at it."""

    seconds: list[float] = field(default_factory=list)
    summarized: list[bool] = field(default_factory=list)
    over_window: int = 0
    requests: int = 0

    def p99(self, summary_turns: bool) -> float:
        times = [
            t for t, s in zip(self.seconds, self.summarized, strict=True) if s or not summary_turns
        ]
        if len(times) < 2:
            return max(times, default=0.0)
        return statistics.quantiles(times, n=100, method="inclusive")[98]


class Answers:
    """The agent model's answers: the dialogues' agent texts in turn."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = replies
        self.n = 0

    def __call__(self, body: dict[str, Any]) -> str:
        text = self.replies[self.n % len(self.replies)]
        self.n += 1
        return text


def _chat_tokens(body: dict[str, Any]) -> int:
    """A chat-completions request's tokens: messages and tool schemas."""
    from recap.core.counting import tokens

    total = tokens.count_messages(body.get("messages", []), ENCODING)
    return total + tokens.count_tools(body.get("tools"), ENCODING)


class TiktokenUsage:
    """The stand-in agent model's usage reading of a chat request: this benchmark's own count
    (the adapters record it, so the budget is calibrated to the count the window is checked
    by here); it refuses nothing (the benchmark counts what goes over)."""

    window = 10**9

    def read(self, body: dict[str, Any]) -> tuple[int, int]:
        return _chat_tokens(body), 0

    def refusal(self, count: int) -> str:
        return f"{count} tokens"


def _responses_tokens(body: dict[str, Any]) -> int:
    """A Responses request's tokens: input items (a compaction item by its summary text, which
    the stand-in puts in its encrypted content), instructions and tool schemas."""
    from recap.core.counting import tokens
    from recap.convert.openai_agents import items_to_messages

    items = body.get("input") or []
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    compacted = [i for i in items if i.get("type") == "compaction"]
    rest = [i for i in items if i.get("type") != "compaction"]
    total = tokens.count_messages(items_to_messages(rest), ENCODING)
    total += sum(
        tokens.count_text(str(i.get("encrypted_content") or ""), ENCODING) for i in compacted
    )
    total += tokens.count_text(str(body.get("instructions") or ""), ENCODING)
    return total + tokens.count_tools(body.get("tools"), ENCODING)


def _talk(
    turn: Callable[[int], None],
    script_tool: Callable[[int], None],
    summaries: Callable[[], int],
    after_turn: Callable[[int], None],
) -> Side:
    """``TURNS`` timed turns; after each (untimed) ``after_turn``, then whether a summary was
    written since the turn began."""
    side = Side()
    for n in range(TURNS):
        script_tool(n)
        before = summaries()
        started = time.perf_counter()
        turn(n)
        side.seconds.append(time.perf_counter() - started)
        after_turn(n)
        side.summarized.append(summaries() > before)
    return side


def _measured(side: Side, requests: list[Any], count: Callable[[dict[str, Any]], int]) -> Side:
    side.requests = len(requests)
    side.over_window = sum(count(r.body) > WINDOW for r in requests)
    return side


@dataclass
class Servers:
    agent: Any  # the agent model: answers at once
    summary: Any  # the summary model of both sides: answers in SUMMARY_SECONDS
    users: list[str]

    def script_tool(self, turn: int) -> None:
        from tests.support.frameworks_stack import tool_call_reply

        if turn % TOOL_EVERY == TOOL_EVERY - 1:
            arguments = json.dumps({"reservation_id": f"R{turn:04d}"})
            self.agent.script(tool_call_reply(f"call_{turn}", "lookup_booking", arguments))

    def user(self, turn: int) -> str:
        return self.users[turn % len(self.users)]


def lookup_booking(reservation_id: str) -> str:
    """Look a reservation up by its id."""
    return json.dumps({"reservation_id": reservation_id, "status": "confirmed"})


def _summaries_of(recap: Any, cid: str) -> Callable[[], int]:
    from recap.core.errors import NotFoundError

    def count() -> int:
        try:
            return len(recap.summaries(cid))
        except NotFoundError:  # before the first turn
            return 0

    return count


def langchain_sides(servers: Servers, recap: Any, stack: Any) -> tuple[Side, Side]:
    """(SummarizationMiddleware, RecapMiddleware) over the conversation."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import SummarizationMiddleware
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.memory import InMemorySaver

    from recap.integrations.langchain import RecapMiddleware

    def model(server: Any) -> Any:
        return ChatOpenAI(model="stand-in", base_url=server.url, api_key="bench-key")

    def agent(middleware: Any) -> Any:
        return create_agent(
            model(servers.agent),
            [tool(lookup_booking)],
            system_prompt=SYSTEM,
            middleware=[middleware],
            checkpointer=InMemorySaver(),
        )

    def turns(graph: Any, thread: str) -> Callable[[int], None]:
        config = {"configurable": {"thread_id": thread}}
        return lambda n: graph.invoke({"messages": [("user", servers.user(n))]}, config)

    peer_agent = agent(
        SummarizationMiddleware(
            model=model(servers.summary), trigger=("tokens", PEER_TRIGGER_TOKENS)
        )
    )
    start = len(servers.agent.requests)
    peer = _talk(
        turns(peer_agent, "lc-peer"),
        servers.script_tool,
        lambda: len(servers.summary.requests),
        lambda _n: None,
    )
    peer = _measured(peer, servers.agent.requests[start:], _chat_tokens)

    thread = "lc-recap"
    recap_agent = agent(RecapMiddleware(recap=recap, max_input_tokens=WINDOW))
    start = len(servers.agent.requests)
    ours = _talk(
        turns(recap_agent, thread),
        servers.script_tool,
        _summaries_of(recap, thread),
        lambda n: stack.wait_runs(thread, n + 1),  # one run per turn
    )
    ours = _measured(ours, servers.agent.requests[start:], _chat_tokens)
    return peer, ours


def agents_sides(servers: Servers, recap: Any, stack: Any) -> tuple[Side, Side]:
    """(OpenAIResponsesCompactionSession, RecapSession) over the conversation."""
    from agents import (
        Agent,
        OpenAIResponsesModel,
        Runner,
        SQLiteSession,
        function_tool,
        set_tracing_disabled,
    )
    from agents.memory import OpenAIResponsesCompactionSession
    from openai import AsyncOpenAI

    from recap.integrations.openai_agents import RecapSession

    set_tracing_disabled(True)
    loop = asyncio.new_event_loop()  # one loop for every turn: the clients' pools live on it
    try:

        def client(server: Any) -> AsyncOpenAI:
            return AsyncOpenAI(base_url=server.url, api_key="bench-key", max_retries=0)

        model = OpenAIResponsesModel(model="stand-in", openai_client=client(servers.agent))
        agent = Agent(
            name="support", instructions=SYSTEM, model=model, tools=[function_tool(lookup_booking)]
        )

        def turns(session: Any) -> Callable[[int], None]:
            def turn(n: int) -> None:
                loop.run_until_complete(Runner.run(agent, servers.user(n), session=session))

            return turn

        compaction = OpenAIResponsesCompactionSession(
            "agents-peer",
            SQLiteSession("agents-peer"),
            client=client(servers.summary),
            model=COMPACT_MODEL,
            compaction_mode="input",
        )
        start = len(servers.agent.requests)
        peer = _talk(
            turns(compaction),
            servers.script_tool,
            lambda: len(servers.summary.requests),
            lambda _n: None,
        )
        peer = _measured(peer, servers.agent.requests[start:], _responses_tokens)

        cid = "agents-recap"
        session = RecapSession(cid, recap=recap, max_input_tokens=WINDOW)
        runs = [0]

        def wait(n: int) -> None:
            runs[0] += 2 if n % TOOL_EVERY == TOOL_EVERY - 1 else 1  # one per model response
            stack.wait_runs(cid, runs[0])

        start = len(servers.agent.requests)
        ours = _talk(turns(session), servers.script_tool, _summaries_of(recap, cid), wait)
        ours = _measured(ours, servers.agent.requests[start:], _responses_tokens)
        return peer, ours
    finally:
        loop.close()


def _figures(prefix: str, peer_name: str, ours_name: str, peer: Side, ours: Side) -> list[Figure]:
    peer_p99, ours_p99 = peer.p99(summary_turns=True), ours.p99(summary_turns=True)
    setup = f"{TURNS} turns at {WINDOW:,} tokens, summary model answering in {SUMMARY_SECONDS:g} s"
    return [
        Figure(
            f"{prefix}_p99_turn_vs_{peer_name}",
            round(ours_p99 / peer_p99 if peer_p99 else 0.0, 4),
            P99_BOUND,
            f"p99 turn time at the turns where a summary happens, {ours_name} + worker "
            f"({ours_p99 * 1000:.0f} ms, {sum(ours.summarized)} turns) over the peer "
            f"({peer_p99 * 1000:.0f} ms, {sum(peer.summarized)} turns), {setup}",
        ),
        Figure(
            f"{prefix}_requests_over_window",
            ours.over_window,
            "== 0",
            f"{ours_name}'s model requests over the {WINDOW:,}-token window by tiktoken, "
            f"of {ours.requests}",
        ),
        Figure(
            f"{prefix}_{peer_name}_requests_over_window",
            peer.over_window,
            "",
            f"the peer's model requests over the window by tiktoken, of {peer.requests}",
        ),
        Figure(
            f"{prefix}_p99_turn_all_turns_vs_{peer_name}",
            round(ours.p99(False) / (peer.p99(False) or 1.0), 4),
            "",
            f"p99 turn time over all turns, {ours_name} + worker over the peer",
        ),
    ]


def run() -> list[Figure]:
    from recap.core.client import Recap
    from recap.core.settings import get_settings
    from tests.support.frameworks_stack import start_stack
    from tests.support.llm_server import LLMServer, stand_in_summary
    from recap.workers import enqueue
    from recap.workers.logs import configure_logging

    configure_logging(json_output=False, level="WARNING", force=True)  # stdout is the JSON
    users, replies = dialogue_texts()
    agent_server = LLMServer(default=Answers(replies), meter=TiktokenUsage()).start()
    summary_server = LLMServer(default=stand_in_summary, default_delay=SUMMARY_SECONDS).start()
    servers = Servers(agent_server, summary_server, users)
    with tempfile.TemporaryDirectory(prefix="recap-bench-frameworks-") as tmp:
        stack = start_stack(
            Path(tmp),
            agent_server,
            RECAP_SUMMARY_MODEL="openai/stand-in",
            RECAP_SUMMARY_API_BASE=summary_server.url,
            RECAP_SUMMARY_API_KEY="bench-key",
        )
        saved = {k: v for k, v in os.environ.items() if k.startswith("RECAP_")}
        os.environ.update(stack.host_env())  # compress_later reads the broker folder here
        get_settings.cache_clear()
        enqueue.reset()
        recap = Recap(get_settings())
        try:
            lc_peer, lc_ours = langchain_sides(servers, recap, stack)
            ag_peer, ag_ours = agents_sides(servers, recap, stack)
        finally:
            enqueue.reset()
            recap.engine.dispose()
            for key in stack.host_env():
                os.environ.pop(key, None)
            os.environ.update(saved)
            get_settings.cache_clear()
            stack.stop()
            summary_server.stop()
    return [
        *_figures("langchain", "summarization_middleware", "RecapMiddleware", lc_peer, lc_ours),
        *_figures("agents", "responses_compaction", "RecapSession", ag_peer, ag_ours),
    ]
