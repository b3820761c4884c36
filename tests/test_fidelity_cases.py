"""The request-fidelity cases: every number Recap plans with is the one the provider sees for
the request Recap really sends, and no request dead-ends where a fit exists."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from recap.core.client import Recap
from recap.core.errors import BudgetError
from recap.core.request.shorten import SHORTENED
from recap.core.settings import Settings
from recap.core.storage import compressed
from recap.core.storage.db import session_scope
from tests.support.data import load_data


@pytest.fixture
def recap(tmp_path: Path) -> Recap:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'f.db'}",
        output_dir=tmp_path / "outputs",
        max_request_bytes=600_000,
    )
    return Recap(settings, create_schema=True)


def _words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def _call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "grep", "arguments": "{}"}}


def test_a_result_larger_than_the_room_is_sent_shortened(recap: Recap) -> None:
    """A newest step whose one tool output is three times the window: the request is built,
    the output sent as its head and tail with a note, recorded as a 'shortened' clearing, and
    the next request renders the same bytes."""
    cid = recap.new(model="gpt-4o", max_input_tokens=4_000)
    recap.add(cid, {"role": "user", "content": "find the bug"})
    recap.add(cid, {"role": "assistant", "content": "", "tool_calls": [_call("c1")]})
    output = "FIRST-LINE " + _words(5_000) + " LAST-LINE"  # under the ingest limit
    result_id = recap.add(cid, {"role": "tool", "tool_call_id": "c1", "content": output})
    request = recap.assemble(cid)
    sent = request.messages[-1]["content"]
    assert request.tokens.total <= request.budget
    assert sent.startswith("FIRST-LINE") and sent.endswith("LAST-LINE")
    assert "left out here to fit the context window" in sent
    with session_scope(recap.engine) as session:
        clearing = compressed.load_clearings(session, cid)[result_id]
    assert clearing.reason == SHORTENED and clearing.tokens_reclaimed > 0
    again = recap.assemble(cid)
    assert json.dumps(again.messages) == json.dumps(request.messages)


def test_the_oldest_steps_of_a_turn_are_left_out_and_reported(recap: Recap) -> None:
    """One user message and many steps that no longer fit: the user message and the newest
    step are sent, the oldest steps reported as dropped (no BudgetError)."""
    cid = recap.new(model="gpt-4o", max_input_tokens=3_000)
    user = recap.add(cid, {"role": "user", "content": "fix the tests"})
    ids = []
    for step in range(30):
        ids.append(recap.add(cid, {"role": "assistant", "content": f"step {step}",
                                   "tool_calls": [_call(f"c{step}")]}))  # fmt: skip
        recap.add(cid, {"role": "tool", "tool_call_id": f"c{step}", "content": _words(150)})
    request = recap.assemble(cid)
    assert request.truncated and request.tokens.total <= request.budget
    assert (
        request.messages[0]["content"] == "fix the tests"
        and user not in request.dropped_message_ids
    )
    assert request.messages[-2]["content"] == "step 29"
    assert ids[0] in request.dropped_message_ids and ids[-1] not in request.dropped_message_ids


def test_when_the_last_user_message_cannot_fit_the_error_names_it(recap: Recap) -> None:
    """The one dead end left: the last user message alone is larger than the room."""
    cid = recap.new(model="gpt-4o", max_input_tokens=2_000)
    recap.add(cid, {"role": "user", "content": _words(3_000)})
    with pytest.raises(BudgetError, match="the last user message"):
        recap.assemble(cid)


def test_the_byte_guard_bounds_a_text_conversation(recap: Recap, caplog: Any) -> None:
    """A 2 MB text conversation in a window it fits by tokens: the request is cut to the byte
    limit from its oldest history, and reported as truncated."""
    cid = recap.new(model="gpt-4o", max_input_tokens=1_000_000)
    block = "x" * 20_000  # one token per 8 characters or so, 20 KB a message
    for turn in range(50):
        recap.add(cid, {"role": "user", "content": f"question {turn} {block}"})
        recap.add(cid, {"role": "assistant", "content": f"answer {turn} {block}"})
    recap.add(cid, {"role": "user", "content": "and now?"})
    with caplog.at_level(logging.WARNING, logger="recap.assemble"):
        request = recap.assemble(cid)
    size = len(json.dumps(request.messages, ensure_ascii=False).encode())
    assert size <= 600_000 and request.truncated and request.dropped_message_ids
    assert request.messages[-1]["content"] == "and now?"
    assert any("assemble_truncated" in r.getMessage() for r in caplog.records)


def test_a_reading_stops_being_measured_once_the_request_changes(recap: Recap) -> None:
    """The provider's reading is "measured" for the request it measured; after a clearing or a
    new message, stats report an estimate scaled by it instead."""
    cid = recap.new(model="gpt-4o", max_input_tokens=50_000)
    for n in range(6):
        recap.add(cid, {"role": "user", "content": f"look {n}"})
        recap.add(cid, {"role": "assistant", "content": "", "tool_calls": [_call(f"c{n}")]})
        recap.add(cid, {"role": "tool", "tool_call_id": f"c{n}", "content": _words(2_000)})
    recap.add(cid, {"role": "user", "content": "summarize"})
    sent = recap.assemble(cid)
    recap.record_usage(cid, prompt_tokens=sent.tokens.total + 100)
    measured = recap.stats(cid)
    assert measured["basis"] == "measured" and measured["used"] == sent.tokens.total + 100
    recap.compress(cid, force=True)
    after = recap.stats(cid)
    assert after["basis"] == "estimated" and after["used"] < measured["used"]
    recap.add(cid, {"role": "assistant", "content": "done"})
    assert recap.stats(cid)["basis"] == "estimated"


def test_max_output_tokens_is_the_room_left_for_the_reply(recap: Recap) -> None:
    """The window less the request, capped by the model's maximum output (gpt-4o: 16,384)."""
    small = recap.new(model="gpt-4o", max_input_tokens=3_000)
    recap.add(small, {"role": "user", "content": _words(500)})
    request = recap.assemble(small)
    assert request.max_output_tokens == 3_000 - request.tokens.total
    assert request.as_dict()["max_output_tokens"] == request.max_output_tokens
    large = recap.new(model="gpt-4o")
    recap.add(large, {"role": "user", "content": "hi"})
    assert recap.assemble(large).max_output_tokens == 16_384


def test_swe_agent_runs_at_a_3000_window_never_dead_end(recap: Recap) -> None:
    """The "why" case: SWE-agent runs whose system prompt, task and newest step nearly fill a
    3,000-token window. After a compression, every request is still built."""
    built = 0
    for record in load_data("swe_agent.jsonl")[:6]:
        cid = recap.new(model="gpt-4o", max_input_tokens=3_000)
        for index, message in enumerate(record["messages"]):
            if message["role"] == "assistant" and index:
                request = recap.assemble(cid)
                if request.truncated:  # the host loop without a worker: compress, then again
                    recap.compress(cid)
                    request = recap.assemble(cid)
                assert request.tokens.total <= request.budget
                built += 1
            keep = ("role", "content", "tool_calls", "tool_call_id", "name")
            recap.add(cid, {k: message[k] for k in keep if message.get(k) is not None})
    assert built > 20


def test_the_truncation_reports_the_tokens_left_out(recap: Recap, caplog: Any) -> None:
    """Rows skipped unread because they cannot fit still count in what the request reports
    (``truncated_tokens`` and the log line), as the stored tokens of every message left out."""
    from recap.core.storage import reads

    cid = recap.new(model="gpt-4o", max_input_tokens=4_000)
    for turn in range(300):
        recap.add(cid, {"role": "user", "content": f"question {turn} " + _words(40)})
        recap.add(cid, {"role": "assistant", "content": f"answer {turn} " + _words(40)})
    recap.add(cid, {"role": "user", "content": "and now?"})
    with caplog.at_level(logging.WARNING, logger="recap.assemble"):
        request = recap.assemble(cid)
    with session_scope(recap.engine) as session:
        branch = reads.load_whole_branch(session, cid).branch
    left_out = sum(m.tokens for m in branch if m.id in set(request.dropped_message_ids))
    assert request.truncated and request.truncated_tokens == left_out > 0
    assert any(f"tokens={left_out}" in r.getMessage() for r in caplog.records)


def test_a_context_error_from_the_summarizer_sends_smaller_chunks(tmp_path: Path) -> None:
    """A summary model no map knows (8,192 tokens assumed) that answers one context-length
    error: the run asks again with smaller chunks and summarizes, instead of failing."""
    from tests.support.llm_server import LLMServer, Reply

    server = LLMServer().start()
    try:
        settings = Settings(
            database_url=f"sqlite:///{tmp_path / 's.db'}",
            output_dir=tmp_path / "outputs",
            summary_model="openai/local-unknown-model",
            summary_api_base=server.url,
            summary_api_key="sk-test",
        )
        recap = Recap(settings, create_schema=True)
        cid = recap.new(model="gpt-4o", max_input_tokens=8_000)
        for turn in range(40):
            recap.add(cid, {"role": "user", "content": f"step {turn} " + _words(120, f"t{turn}_")})
            recap.add(cid, {"role": "assistant", "content": f"done {turn} " + _words(60)})
        server.script(
            Reply(status=400, code="context_length_exceeded",
                  error="This model's maximum context length is 6000 tokens. Please reduce the "
                  "length of the messages.")
        )  # fmt: skip
        result = recap.compress(cid, force=True)
        assert result["action"] == "summarized", result
        first, second = server.requests[0], server.requests[1]
        assert len(second.text) < len(first.text)
    finally:
        server.stop()


def test_a_run_reports_the_figures_stats_shows(recap: Recap) -> None:
    """A summary under a calibration of 0.5: the run's tokens before and after are provider
    tokens, as stats shows them (before the fix, raw estimates were taken off calibrated ones
    and tokens_after went negative)."""
    cid = recap.new(model="gpt-4o", max_input_tokens=20_000)
    for turn in range(30):
        recap.add(cid, {"role": "user", "content": f"question {turn} " + _words(200)})
        recap.add(cid, {"role": "assistant", "content": f"answer {turn} " + _words(200)})
    sent = recap.assemble(cid)
    recap.record_usage(cid, prompt_tokens=sent.tokens.total // 2)
    before = recap.stats(cid)
    result = recap.compress(cid, force=True)
    assert result["action"] == "summarized", result
    after = recap.stats(cid)
    assert abs(result["tokens_before"] - before["history"]) <= 2
    assert 0 < result["tokens_after"] < result["tokens_before"]
    assert abs(result["tokens_after"] - after["history"]) <= 2


def test_an_early_skip_reports_what_stats_shows(recap: Recap) -> None:
    """A run that skips from the bound alone (no branch read) reports the history stats shows:
    clearings taken off, the stored system prompt left to the fixed parts (it reported the
    upper bound before)."""
    from recap.core.storage.sweep import apply_clearings
    from recap.core.values.clearing import ClearingPlan, PlannedClearing

    cid = recap.new(model="gpt-4o", max_input_tokens=100_000)
    recap.add(cid, {"role": "system", "content": "You are terse. " + _words(300)})
    recap.add(cid, {"role": "user", "content": "look"})
    recap.add(cid, {"role": "assistant", "content": "", "tool_calls": [_call("c1")]})
    result_id = recap.add(cid, {"role": "tool", "tool_call_id": "c1", "content": _words(2_000)})
    recap.add(cid, {"role": "user", "content": "thanks"})
    with session_scope(recap.engine) as session:
        apply_clearings(
            session,
            cid,
            ClearingPlan("idle", (PlannedClearing(message_id=result_id, tokens_reclaimed=3_000),)),
        )
    result = recap.compress(cid)
    assert result["action"] == "skipped"
    assert result["tokens_before"] == recap.stats(cid)["history"]
