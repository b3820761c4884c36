"""A LangChain agent with ``SummarizationMiddleware`` against the same agent with
``RecapMiddleware`` and a ``recap worker``, over the same 60-turn conversation at an 8,000-token
window.

Both agents are ``create_agent`` with one tool, an in-memory checkpointer and ``ChatOpenAI`` on
the stand-in model server (answering at once); the conversation is the tau-bench airline
dialogues' own user and agent texts, a few turns calling the tool. Both summarize with the same
summary model: a second stand-in server answering every request in 1 s. The peer runs with its
defaults (keep the last 20 messages, LangChain's approximate token counter) and the one setting
it needs to summarize at all (its default trigger is none): ``trigger=("tokens", 6400)``, 80 %
of the window, the fraction its documentation shows. Recap runs with its defaults
(``max_input_tokens=8000``), its worker summarizing in the background; the benchmark waits for
the worker's run between turns, outside the timed turn, as a user's think time would.

Figures: the p99 turn time (``invoke``, wall clock) over the turns at which a summary happens
(the peer's summary call inside the turn; the turn whose enqueued run summarized, for Recap),
Recap's over the peer's; and the requests the agent model received that were over the window,
counted by tiktoken (``o200k_base``, messages and tool schemas), for each side.

The Agents SDK's ``OpenAIResponsesCompactionSession`` is not measured: it calls OpenAI's
``responses.compact`` endpoint, which no offline server here offers.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
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
AGENTS_SKIPPED = (
    "the Agents SDK's OpenAIResponsesCompactionSession is not measured: it calls OpenAI's "
    "responses.compact endpoint, which no offline server here offers"
)


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


def _over_window(requests: list[Any]) -> int:
    from core.counting import tokens

    over = 0
    for request in requests:
        total = tokens.count_messages(request.body.get("messages", []), ENCODING)
        total += tokens.count_tools(request.body.get("tools"), ENCODING)
        over += total > WINDOW
    return over


def _talk(
    agent: Any,
    thread: str,
    users: list[str],
    script_tool: Callable[[int], None],
    summaries: Callable[[], int],
    after_turn: Callable[[int], None],
) -> Side:
    side = Side()
    config = {"configurable": {"thread_id": thread}}
    for turn in range(TURNS):
        script_tool(turn)
        before = summaries()
        started = time.perf_counter()
        agent.invoke({"messages": [("user", users[turn % len(users)])]}, config)
        side.seconds.append(time.perf_counter() - started)
        after_turn(turn)
        side.summarized.append(summaries() > before)
    return side


def run() -> list[Figure]:
    from langchain.agents import create_agent
    from langchain.agents.middleware import SummarizationMiddleware
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.memory import InMemorySaver

    from core.client import Recap
    from core.errors import NotFoundError
    from core.settings import get_settings
    from recap.integrations.langchain import RecapMiddleware
    from tests.frameworks_stack import start_stack, tool_call_reply
    from tests.llm_server import LLMServer, stand_in_summary
    from workers import enqueue
    from workers.logs import configure_logging

    configure_logging(json_output=False, level="WARNING", force=True)  # stdout is the JSON
    print(f"bench.frameworks: {AGENTS_SKIPPED}", file=sys.stderr)
    users, replies = dialogue_texts()

    @tool
    def lookup_booking(reservation_id: str) -> str:
        """Look a reservation up by its id."""
        return json.dumps({"reservation_id": reservation_id, "status": "confirmed"})

    agent_server = LLMServer(default=Answers(replies)).start()
    summary_server = LLMServer(default=stand_in_summary, default_delay=SUMMARY_SECONDS).start()

    def model(server: LLMServer) -> Any:
        return ChatOpenAI(model="stand-in", base_url=server.url, api_key="bench-key")

    def script_tool(turn: int) -> None:
        if turn % TOOL_EVERY == TOOL_EVERY - 1:
            arguments = json.dumps({"reservation_id": f"R{turn:04d}"})
            agent_server.script(tool_call_reply(f"call_{turn}", "lookup_booking", arguments))

    # the peer: SummarizationMiddleware summarizing inside the turn
    peer_middleware = SummarizationMiddleware(
        model=model(summary_server), trigger=("tokens", PEER_TRIGGER_TOKENS)
    )
    peer = create_agent(
        model(agent_server),
        [lookup_booking],
        system_prompt=SYSTEM,
        middleware=[peer_middleware],
        checkpointer=InMemorySaver(),
    )
    start = len(agent_server.requests)
    peer_side = _talk(
        peer, "peer", users, script_tool, lambda: len(summary_server.requests), lambda _t: None
    )
    peer_requests = agent_server.requests[start:]
    peer_side.requests, peer_side.over_window = len(peer_requests), _over_window(peer_requests)
    print(f"peer: {sum(peer_side.summarized)} summary turns", file=sys.stderr)

    # Recap: the same agent with RecapMiddleware, a worker summarizing in the background
    with tempfile.TemporaryDirectory(prefix="recap-bench-frameworks-") as tmp:
        stack = start_stack(
            Path(tmp),
            agent_server,
            RECAP_SUMMARY_MODEL="openai/stand-in",
            RECAP_SUMMARY_API_BASE=summary_server.url,
            RECAP_SUMMARY_API_KEY="bench-key",
        )
        saved = {k: v for k, v in os.environ.items() if k.startswith("RECAP_")}
        os.environ.update(stack.host_env())
        get_settings.cache_clear()
        enqueue.reset()
        recap = Recap(get_settings())
        try:
            middleware = RecapMiddleware(recap=recap, max_input_tokens=WINDOW)
            agent = create_agent(
                model(agent_server),
                [lookup_booking],
                system_prompt=SYSTEM,
                middleware=[middleware],
                checkpointer=InMemorySaver(),
            )
            thread = "recap-bench"
            start = len(agent_server.requests)

            def summaries() -> int:
                try:
                    return len(recap.summaries(thread))
                except NotFoundError:  # before the first turn
                    return 0

            recap_side = _talk(
                agent,
                thread,
                users,
                script_tool,
                summaries,
                lambda turn: stack.wait_runs(thread, turn + 1),
            )
            recap_requests = agent_server.requests[start:]
            recap_side.requests = len(recap_requests)
            recap_side.over_window = _over_window(recap_requests)
            stored = len(recap.export(thread).messages)
        finally:
            enqueue.reset()
            recap.engine.dispose()
            for key in stack.host_env():
                os.environ.pop(key, None)
            os.environ.update(saved)
            get_settings.cache_clear()
            stack.stop()
            summary_server.stop()
    print(
        f"recap: {sum(recap_side.summarized)} summary turns, {stored} messages stored",
        file=sys.stderr,
    )
    peer_p99 = peer_side.p99(summary_turns=True)
    recap_p99 = recap_side.p99(summary_turns=True)
    ratio = recap_p99 / peer_p99 if peer_p99 else 0.0
    return [
        Figure(
            "langchain_p99_turn_vs_summarization_middleware",
            round(ratio, 4),
            P99_BOUND,
            f"p99 turn time at the turns where a summary happens, RecapMiddleware + worker "
            f"({recap_p99 * 1000:.0f} ms) over SummarizationMiddleware ({peer_p99 * 1000:.0f} ms), "
            f"{TURNS} turns at {WINDOW:,} tokens, summary model answering in {SUMMARY_SECONDS:g} s",
        ),
        Figure(
            "langchain_requests_over_window",
            recap_side.over_window,
            "== 0",
            f"RecapMiddleware's model requests over the {WINDOW:,}-token window by tiktoken, "
            f"of {recap_side.requests}",
        ),
        Figure(
            "langchain_summarization_middleware_requests_over_window",
            peer_side.over_window,
            "",
            f"SummarizationMiddleware's model requests over the window by tiktoken, of "
            f"{peer_side.requests} (its approximate counter triggers at {PEER_TRIGGER_TOKENS:,})",
        ),
        Figure(
            "langchain_p99_turn_all_turns_vs_summarization_middleware",
            round(recap_side.p99(False) / (peer_side.p99(False) or 1.0), 4),
            "",
            "p99 turn time over all turns, RecapMiddleware + worker over SummarizationMiddleware",
        ),
    ]
