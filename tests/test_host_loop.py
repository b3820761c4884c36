"""The README's host loop never hits a dead end, and the decision sees the host's tools.

An agent run is one user message and hundreds of tool steps: on a 16k window that one turn
outgrows the budget, and ``assemble`` raises ``BudgetError``. The loop then calls
``Recap.compress`` (the worker's run, in-process) and retries once; the summary cuts inside the
turn at a step boundary, never between a call and its result.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from recap.core import service
from recap.core.client import Recap
from recap.core.errors import BudgetError
from recap.core.settings import Settings
from recap.core.storage.db import session_scope
from recap.core.storage.models import MESSAGES, SUMMARIES

STEPS = 400  # tool steps in the one agent turn
WINDOW = 16_000
RESULT_WORDS = 120  # about 150 tokens of tool output per step
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{n}",
            "description": "Runs one thing in the workspace and returns what it printed. " * 8,
            "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}},
        },
    }
    for n in range(12)
]


def assemble_or_compress(recap: Recap, cid: str) -> Any:
    """The README's loop without a worker: assemble; when the request had to leave history out
    (or on BudgetError) compress now and assemble once more."""
    try:
        request = recap.assemble(cid, tools=TOOLS)
        if not request.truncated:
            return request
    except BudgetError:
        pass
    recap.compress(cid)
    return recap.assemble(cid, tools=TOOLS)


def agent_turn(
    recap: Recap,
    cid: str,
    *,
    steps: int = STEPS,
    result_words: int = RESULT_WORDS,
    after_step: Callable[[], object] | None = None,
) -> None:
    """One user message and ``steps`` tool steps through the README's loop (``call_0`` every
    step, as servers that number calls per turn send it); every request within its budget."""
    recap.add(cid, {"role": "user", "content": "Fix the failing tests in the repository."})
    for step in range(steps):
        request = assemble_or_compress(recap, cid)
        assert request.tokens.total <= request.budget
        call = {
            "id": "call_0",
            "type": "function",
            "function": {"name": "tool_1", "arguments": "{}"},
        }
        recap.add(cid, {"role": "assistant", "content": f"step {step}", "tool_calls": [call]})
        output = " ".join(f"line{step}-{i}" for i in range(result_words))
        recap.add(cid, {"role": "tool", "tool_call_id": "call_0", "content": output})
        if after_step is not None:
            after_step()
    assert assemble_or_compress(recap, cid).tokens.total <= WINDOW


def assert_cuts_at_step_boundaries(recap: Recap, cid: str) -> None:
    """Something was summarized, and every summary covers whole steps: a result, then the
    next call."""
    with session_scope(recap.engine) as session:
        connection = session.connection()
        of_cid = SUMMARIES.c.conversation_id == cid
        cutoffs = [
            r[0] for r in connection.execute(select(SUMMARIES.c.cutoff_message_id).where(of_cid))
        ]
        roles = dict(
            connection.execute(
                select(MESSAGES.c.id, MESSAGES.c.role).where(MESSAGES.c.conversation_id == cid)
            ).all()
        )
    assert cutoffs, "the turn outgrew the window, so something was summarized"
    for cutoff in cutoffs:
        assert roles[cutoff] == "tool" and roles[cutoff + 1] == "assistant"


@pytest.fixture
def recap(tmp_path: Path) -> Recap:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'host.db'}", output_dir=tmp_path / "outputs"
    )
    return Recap(settings, create_schema=True)


def test_an_agent_turn_of_400_steps_never_raises(recap: Recap) -> None:
    """400 steps of one turn on a 16k window: every request is assembled, within the budget,
    and every summary cuts at a step boundary with valid pairs."""
    cid = recap.new(max_input_tokens=WINDOW)
    agent_turn(recap, cid)
    assert_cuts_at_step_boundaries(recap, cid)


def test_the_decision_sees_the_host_s_tools(recap: Recap, caplog: Any) -> None:
    """The "why" case: a conversation at a 7,600-token window with 3.7k tokens of tool schemas
    passed to assemble. Once assemble has recorded them, stats suggests compressing and a run
    summarizes, so the next request keeps its history instead of truncating it."""
    tools = [
        {
            "type": "function",
            "function": {"name": f"t{n}", "description": "word " * 280, "parameters": {}},
        }
        for n in range(12)
    ]
    messages = [{"role": "system", "content": "You are a careful assistant."}]
    for n in range(16):  # about 4.7k tokens: under the trigger of history alone (5.4k)
        messages.append({"role": "user", "content": f"question {n} " + "about things " * 70})
        messages.append({"role": "assistant", "content": f"answer {n} " + "with details " * 70})
    service.import_conversations(
        recap.engine, [{"id": "why", "messages": messages}], recap.settings, max_input_tokens=7_600
    )
    assert not recap.stats("why")["suggest_compress"]  # history alone looks fine
    with caplog.at_level(logging.WARNING, logger="recap.assemble"):
        first = recap.assemble("why", tools=tools)
    assert 3_400 <= first.tokens.tools <= 4_000
    assert first.truncated and first.dropped_message_ids  # reported, never silent
    assert any("assemble_truncated" in r.getMessage() for r in caplog.records)
    stats = recap.stats("why")
    assert stats["suggest_compress"] and stats["fixed"] >= first.tokens.tools
    assert recap.compress("why")["action"] == "summarized"
    after = recap.assemble("why", tools=tools)
    assert not after.truncated and after.summary_id is not None


def test_compress_needs_no_celery(tmp_path: Path) -> None:
    """The synchronous call imports neither Celery nor litellm (the extractive summarizer)."""
    import subprocess

    code = (
        "import sys\n"
        "from core.client import Recap\n"
        "from core.settings import Settings\n"
        f"r = Recap(Settings(database_url='sqlite:///{tmp_path / 'x.db'}'), create_schema=True)\n"
        "cid = r.new(max_input_tokens=4000)\n"
        "r.add(cid, {'role': 'user', 'content': 'hi'})\n"
        "print(r.compress(cid)['action'])\n"
        "print(sorted(m for m in ('celery', 'kombu', 'litellm') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    lines = [line for line in done.stdout.splitlines() if not line.startswith("20")]  # no logs
    assert lines == ["skipped", "[]"], done.stdout + done.stderr


class _Recording:
    """A host's own summarizer and reporter (``core.compression.run.Parts``)."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.spans: list[int] = []

    def summarizers(self, settings: Settings, attempt: int, deadline: float) -> Any:
        return self

    def summarize(self, snapshot: Any, split: Any) -> Any:
        from recap.core.compression.summarizer import SummaryText

        self.spans.append(len(split.older))
        return SummaryText(text="The user asked about things; " * 3, model="host", retention=1.0)

    def emit(self, settings: Settings, event: str, **fields: Any) -> None:
        self.events.append(event)


def _long_conversation(recap: Recap) -> str:
    cid = recap.new(max_input_tokens=4_000)
    for n in range(30):
        recap.add(cid, {"role": "user", "content": f"question {n} " + "about things " * 40})
        recap.add(cid, {"role": "assistant", "content": f"answer {n} " + "with details " * 40})
    return cid


def test_a_host_passes_its_own_summarizer_and_reporter(tmp_path: Path) -> None:
    """``Recap(parts=...)``: the run (core code) calls the host's summarizer and reports to the
    host's reporter; the stored summary is the host's text."""
    from recap.core.compression.report import COMPLETED, STARTED
    from recap.core.compression.run import Parts

    host = _Recording()
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'own.db'}")
    recap = Recap(settings, create_schema=True, parts=Parts(host.summarizers, host))
    cid = _long_conversation(recap)
    done = recap.compress(cid, force=True)
    assert done.action == "summarized" and done["action"] == "summarized"
    assert host.spans and host.spans[0] > 0
    assert host.events == [STARTED, COMPLETED]
    assert recap.summaries(cid)[-1].model == "host"


@pytest.mark.parametrize(
    ("summary_model", "action"),
    [(None, "summarized"), ("openai/gpt-4o-mini", "failed")],
)
def test_core_s_own_parts_never_ignore_a_summary_model(
    tmp_path: Path, summary_model: str | None, action: str
) -> None:
    """Core without the workers' transport summarizes offline, and with a summary model set it
    fails the run with one clear reason instead of silently summarizing offline."""
    from recap.core.compression.run import Parts

    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'core.db'}", summary_model=summary_model
    )
    recap = Recap(settings, create_schema=True, parts=Parts())
    cid = _long_conversation(recap)
    done = recap.compress(cid, force=True)
    assert done.action == action
    if action == "failed":
        assert "no model summarizer is installed" in done.reason


def test_the_installation_provides_the_workers_parts() -> None:
    """The ``recap.engine`` entry point gives core the workers' summarizer and publisher."""
    from recap.core.compression.run import installed_parts
    from recap.workers.compress import PARTS

    assert installed_parts() is PARTS
