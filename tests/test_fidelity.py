"""Live-host fidelity: every decision sees the request the host really sends, and no request
silently loses history.

The "why" case of the design notes: a conversation imported at a 7,600-token window, the host
passing 3.6k tokens of tool schemas to ``assemble``. History alone (3k tokens) is far under its
trigger, but beside the tools it is over it: once ``assemble`` has recorded what the host sends,
``stats`` suggests compressing, reconcile enqueues the conversation and the worker summarizes
before ``assemble`` has to drop anything. The same holds when ``recap replay`` sends each
conversation's tools, and the README's host loop keeps a 400-step agent turn going with a real
worker running beside it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from recap.core import service
from recap.core.client import Recap
from recap.core.settings import Settings
from recap.core.storage.db import make_engine
from recap.core.storage.migrate import upgrade
from recap.core.storage.models import CompactionLog, table_of
from recap.workers import replay
from recap.workers.enqueue import compress_later
from tests.support.cli_helpers import Result, recap, recap_process
from tests.support.llm_server import LLMServer
from tests.support.services import RedisServer, need_redis_server
from tests.support.worker_stack import WorkerProcess, wait_for, worker_env
from tests.test_host_loop import agent_turn, assert_cuts_at_step_boundaries

WINDOW = 7_600  # the window of the report that opened this work
SYSTEM = "You are a careful assistant."
TOOLS = [  # twelve schemas of about 300 tokens: 3.6k tokens in all
    {
        "type": "function",
        "function": {"name": f"t{n}", "description": "word " * 280, "parameters": {}},
    }
    for n in range(12)
]
IMPORTED_TURNS = 10  # about 3k tokens: under the trigger of history alone, over it beside tools
AGENT_WINDOW = 16_000
AGENT_RESULT_WORDS = 60  # about 80 tokens of output per step: lean, and still many summaries
SERVED_TIMEOUT = 60.0  # a run the worker was sent finishes within this
LOG = table_of(CompactionLog)


def chat(turns: int, start: int = 0) -> list[dict[str, Any]]:
    """``turns`` user/assistant exchanges of about 150 tokens a message."""
    messages: list[dict[str, Any]] = []
    for n in range(start, start + turns):
        messages.append({"role": "user", "content": f"question {n} " + "about things " * 70})
        messages.append({"role": "assistant", "content": f"answer {n} " + "with details " * 70})
    return messages


def imported(engine: Engine, settings: Settings, cid: str, turns: int, window: int) -> None:
    """The "why" conversation, imported as a team would bring its history in."""
    record = {"id": cid, "messages": [{"role": "system", "content": SYSTEM}, *chat(turns)]}
    service.import_conversations(engine, [record], settings, max_input_tokens=window)


# --- the decision, table-driven ----------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One host setup: what it passes, what was recorded, and what the decision must say."""

    name: str
    window: int
    tools: list[dict[str, Any]] | None
    assembled_first: bool
    default_fixed: int
    suggest: bool
    action: str


CASES = [
    Case("why: the host's tools recorded by assemble", WINDOW, TOOLS, True, 0, True, "summarized"),
    Case("never assembled: history alone looks fine", WINDOW, TOOLS, False, 0, False, "skipped"),
    Case(
        "never assembled: the default fixed parts", WINDOW, TOOLS, False, 3_600, True, "summarized"
    ),
    Case("a host that sends no tools", WINDOW, None, True, 0, False, "skipped"),
    Case("the same tools in a roomy window", 32_000, TOOLS, True, 0, False, "skipped"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_decision_plans_with_what_the_host_sends(case: Case, tmp_path: Path) -> None:
    """``stats`` and a run plan with the fixed parts ``assemble`` recorded (else the default),
    and the request that follows keeps all of its history."""
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'why.db'}",
        output_dir=tmp_path / "outputs",
        default_fixed_tokens=case.default_fixed,
    )
    host = Recap(settings, create_schema=True)
    imported(host.engine, settings, "why", IMPORTED_TURNS, case.window)
    if case.assembled_first:
        assert not host.assemble("why", system=SYSTEM, tools=case.tools).truncated
    assert host.stats("why")["suggest_compress"] is case.suggest
    assert host.compress("why")["action"] == case.action
    after = host.assemble("why", system=SYSTEM, tools=case.tools)
    assert not after.truncated and after.dropped_message_ids == []
    assert (after.summary_id is not None) is (case.action == "summarized")


# --- replay with the host's fixed parts ---------------------------------------------------------


def agent_record(turns: int) -> dict[str, Any]:
    """A conversation that brings its own tool schemas, growing past the window."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, *chat(turns)]
    return {"id": "with-tools", "tools": TOOLS, "messages": messages}


@pytest.mark.parametrize(
    ("profile_blind", "silent"),
    [(False, False), (True, True)],
    ids=["the decision sees the profile", "history alone (before the profile)"],
)
def test_replay_counts_silent_truncations(profile_blind: bool, silent: bool) -> None:
    """Replayed with its own tools at 7,600 tokens, the conversation never loses history
    silently; planning with history alone, as before, it does."""
    host = replay.Host(profile_blind=profile_blind)
    report = replay.replay_records([agent_record(24)], Settings(), window=WINDOW, host=host)
    (conversation,) = report["conversations"]
    assert conversation["tools_from_data"] and conversation["fixed_tokens"] >= 3_400
    assert conversation["errors"] == [] and conversation["over_window"] == 0
    assert conversation["summaries"] >= 1
    assert (conversation["silent_truncations"] > 0) is silent, conversation
    assert report["total"]["silent_truncations"] == conversation["silent_truncations"]


def test_replay_takes_the_fixed_parts_it_is_not_given() -> None:
    """Without schemas in the data, every record of one source shares one schema for every
    tool any of them calls; without a system message, a representative prompt is sent."""

    def calling(name: str, arguments: dict[str, str]) -> dict[str, Any]:
        function = {"name": name, "arguments": json.dumps(arguments)}
        call = {"id": "c1", "type": "function", "function": function}
        return {
            "source": "one-host",
            "messages": [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "done"},
            ],
        }

    records = [calling("bash", {"command": "ls"}), calling("open", {"path": "a.py"})]
    first, second = replay.toolsets(records)
    assert first == second
    names = [tool["function"]["name"] for tool in first]
    assert names == ["bash", "open"]
    assert first[1]["function"]["parameters"]["required"] == ["path"]
    parts = replay.host_parts(records[0], first)
    assert parts.system == replay.REPRESENTATIVE_SYSTEM and not parts.tools_from_data


# --- recap assemble says when it truncated --------------------------------------------------------


def test_recap_assemble_shows_a_truncation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the tools passed, the imported history no longer fits: the human output says how
    much was left out, the JSON says ``truncated``; a request that fits says nothing."""
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("RECAP_DATABASE_URL", url)
    engine = make_engine(url)
    upgrade(engine)
    imported(engine, Settings(database_url=url), "why", 16, WINDOW)
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    shown = recap("assemble", "why", "--tools", str(tools))
    assert shown.code == 0, shown.stderr
    assert "truncated:" in shown.stdout and "messages left out" in shown.stdout
    payload = recap("assemble", "why", "--tools", str(tools), "--json").json()
    assert payload["truncated"] is True and payload["dropped_message_ids"]
    whole = recap("assemble", "why")
    assert whole.code == 0 and "truncated" not in whole.stdout
    engine.dispose()


# --- with a real worker -------------------------------------------------------------------------


@dataclass
class Stack:
    """A private Redis, a ``recap worker`` process on it calling the local model server, and
    the host's handle on the same database."""

    host: Recap
    broker_url: str
    env: dict[str, str]
    worker: WorkerProcess

    def cli(self, *args: str) -> Result:
        return recap_process(*args, env=self.env)

    def wait_runs(self, cid: str, count: int) -> None:
        """Until the compaction log holds ``count`` runs of the conversation."""
        what = f"run {count} of {cid}"
        wait_for(lambda: self.runs(cid) >= count, SERVED_TIMEOUT, what, self.worker.log)

    def runs(self, cid: str) -> int:
        with self.host.engine.connect() as connection:
            total = func.coalesce(func.sum(LOG.c.repeats), 0)  # consecutive skips share a row
            statement = select(total).where(LOG.c.conversation_id == cid)
            return int(connection.execute(statement).scalar_one())


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    need_redis_server()
    folder = tmp_path_factory.mktemp("fidelity")
    url = f"sqlite:///{folder / 'recap.db'}"
    server = LLMServer().start()
    with RedisServer.started() as broker:
        env = worker_env(
            RECAP_DATABASE_URL=url,
            RECAP_BROKER_URL=broker.url,
            RECAP_SUMMARY_MODEL="openai/stand-in",
            RECAP_SUMMARY_API_BASE=server.url,
            RECAP_SUMMARY_API_KEY="test-key",
            RECAP_RETRY_BACKOFF_MAX="1",
            RECAP_OUTPUT_DIR=str(folder / "outputs"),
        )
        worker = WorkerProcess(env, folder / "worker.log").launch()  # starts while the host does
        try:
            settings = Settings(
                database_url=url, broker_url=broker.url, output_dir=folder / "outputs"
            )
            host = Recap(settings, create_schema=True)
            worker.wait_ready(1)
            yield Stack(host, broker.url, env, worker)
            host.engine.dispose()
        finally:
            worker.stop()
            server.stop()


def test_the_worker_summarizes_before_assemble_drops_history(stack: Stack) -> None:
    """The "why" case end to end: history alone does not suggest compressing; once the host's
    request is recorded, ``recap stats`` does, ``recap reconcile`` enqueues the conversation,
    the worker summarizes it, and every later turn is sent whole while the host enqueues a run
    after each."""
    host, cid = stack.host, f"why-{uuid.uuid4().hex[:8]}"
    imported(host.engine, host.settings, cid, IMPORTED_TURNS, WINDOW)
    assert stack.cli("stats", cid, "--json").json()["suggest_compress"] is False
    first = host.assemble(cid, system=SYSTEM, tools=TOOLS)
    assert not first.truncated
    stats = stack.cli("stats", cid, "--json").json()
    assert stats["suggest_compress"] is True and stats["fixed"] >= first.tokens.tools
    assert stack.cli("reconcile", "--json").json()["enqueued"] >= 1
    wait_for(
        lambda: service.list_summaries(host.engine, cid),
        SERVED_TIMEOUT,
        "a summary",
        stack.worker.log,
    )
    for n in range(IMPORTED_TURNS, IMPORTED_TURNS + 8):
        user, reply = chat(1, start=n)
        host.add(cid, user)
        request = host.assemble(cid, system=SYSTEM, tools=TOOLS)
        assert not request.truncated, f"turn {n} dropped {request.dropped_message_ids}"
        host.add(cid, reply)
        runs = stack.runs(cid)
        compress_later(cid, broker_url=stack.broker_url)
        stack.wait_runs(cid, runs + 1)
    assert len(service.list_summaries(host.engine, cid)) >= 2


@pytest.mark.slow  # tests/test_host_loop.py runs the 400-step turn in the suite
def test_an_agent_turn_of_400_steps_with_a_worker_never_raises(stack: Stack) -> None:
    """The README's loop on a 16k window, a run enqueued after every step: the worker and the
    synchronous compress share the lease, no request raises or exceeds its budget, and every
    summary cuts at a step boundary."""
    cid = stack.host.new(max_input_tokens=AGENT_WINDOW)
    agent_turn(
        stack.host,
        cid,
        result_words=AGENT_RESULT_WORDS,
        after_step=lambda: compress_later(cid, broker_url=stack.broker_url),
    )
    assert_cuts_at_step_boundaries(stack.host, cid)
    assert "Traceback" not in stack.worker.text()
