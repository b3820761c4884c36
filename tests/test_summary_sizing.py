"""A summary is planned for its room and stays bounded, cycle after cycle.

The room the decision gives a summary reaches the summarizer (its prompt and its ``max_tokens``),
an answer over it is cut at whole lines, a progressive summary stays under the cap
(``RECAP_SUMMARY_MAX_OUTPUT_TOKENS``) however many cycles it goes through, and a summarizer
answering context-length errors is sent a request of the size its window takes after one refusal.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest

from recap.core.client import Recap
from recap.core.counting import tokens
from recap.core.settings import Settings
from recap.core.summaries.extractive import extractive_summary
from recap.core.summaries.sizing import cut_summary, summary_limit
from recap.core.values.records import Msg
from tests.support.llm_server import LLMServer, Reply
from recap.workers.summarizers import SHORTER, stated_window

ENCODING = "o200k_base"


def count(text: str) -> int:
    return tokens.count_text(text, ENCODING)


def _words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


# --- cutting, with plain values -----------------------------------------------------------------

SUMMARY = "## Goal\n- fix the login bug\n## Done\n- a1\n- a2\n- a3\n- a4\n## Next steps\n- b1\n- b2"


@pytest.mark.parametrize(
    ("limit", "kept", "gone"),
    [
        (10_000, ["- a1", "- a4", "- b1"], []),  # within: unchanged
        (count(SUMMARY) - 1, ["- a2", "- a4", "- b1", "- b2"], ["- a1"]),  # longest, oldest first
        (count(SUMMARY) - 7, ["- a4", "- b2", "## Goal"], ["- a1", "- a2"]),
    ],
)
def test_cut_summary_drops_the_oldest_items_of_the_longest_section(
    limit: int, kept: list[str], gone: list[str]
) -> None:
    cut = cut_summary(SUMMARY, limit, count)
    assert count(cut) <= limit
    lines = cut.splitlines()
    assert all(line in lines for line in kept), cut
    assert not any(line in lines for line in gone), cut


def test_cut_summary_of_one_long_line_cuts_it_by_characters() -> None:
    text = _words(3_000)
    cut = cut_summary(text, 200, count)
    assert count(cut) <= 200 < count(text) and cut.endswith("[...]")
    assert text.startswith(cut.removesuffix(" [...]"))


def test_summary_limit_is_the_room_within_the_cap() -> None:
    assert summary_limit(None, 2_000) == 2_000
    assert summary_limit(500, 2_000) == 500
    assert summary_limit(5_000, 2_000) == 2_000


@pytest.mark.parametrize("seed", range(30))
def test_cut_summary_random(seed: int) -> None:
    """Random template summaries and limits, against the simple rule: within the limit, never
    longer, unchanged when it fits, every heading kept while any item could go instead."""
    rng = random.Random(seed)
    lines: list[str] = []
    for section in range(rng.randint(1, 8)):
        lines.append(f"## Section {section}")
        lines += [
            f"- item {section}.{i} " + _words(rng.randint(1, 40)) for i in range(rng.randint(0, 12))
        ]
    text = "\n".join(lines)
    limit = rng.randint(5, count(text) + 50)
    cut = cut_summary(text, limit, count)
    assert count(cut) <= limit
    assert len(cut) <= len(text)
    if count(text) <= limit:
        assert cut == text
    headings = [line for line in lines if line.startswith("#")]
    sections_with_items = sum(
        1
        for i, line in enumerate(lines)
        if line.startswith("#") and i + 1 < len(lines) and lines[i + 1].startswith("- ")
    )
    if count("\n".join([*headings[:1], *("- x" for _ in range(sections_with_items))])) < limit // 4:
        assert all(h in cut.splitlines() for h in headings[:1])


def test_context_errors_name_their_window() -> None:
    assert stated_window("This model's maximum context length is 8,192 tokens. However") == 8192
    assert stated_window("prompt is too long: 210000 tokens > 200000 maximum") == 200_000
    assert stated_window("the request exceeds the available context size of 4096") == 4096
    assert stated_window("exceeds the context window of 4096 tokens") == 4096
    assert stated_window("something else") is None


# --- a progressive summary stays bounded --------------------------------------------------------


def test_the_extractive_summary_stays_bounded_over_100_cycles() -> None:
    """Each cycle merges a new span into the previous summary: after 100 cycles it is at most
    1.5 times its size after 10 (sections merged, not appended)."""
    rng = random.Random(7)
    previous: str | None = None
    sizes: dict[int, int] = {}
    next_id = 1
    for cycle in range(1, 101):
        span = []
        for _ in range(6):
            role = rng.choice(["user", "assistant"])
            words = " ".join(
                f"src/mod{rng.randint(0, 9999)}.py"
                if rng.random() < 0.1
                else f"word{rng.randint(0, 99999)}"
                for _ in range(rng.randint(5, 80))
            )
            span.append(Msg(next_id, next_id - 1 or None, role, words, count(words)))
            next_id += 1
        previous = extractive_summary(span, previous_summary=previous)
        sizes[cycle] = count(previous)
    assert sizes[100] / sizes[10] <= 1.5, sizes


# --- the room reaches the summarizer, end to end ------------------------------------------------


def _conversation(recap: Recap, window: int, turns: int) -> str:
    cid = recap.new(model="gpt-4o", max_input_tokens=window)
    for turn in range(turns):
        recap.add(cid, {"role": "user", "content": f"step {turn} " + _words(90, f"t{turn}_")})
        recap.add(cid, {"role": "assistant", "content": f"done {turn} " + _words(60, f"a{turn}_")})
    return cid


def _settings(tmp_path: Path, server: LLMServer, **extra: Any) -> Settings:
    chosen: dict[str, Any] = {"summary_model": "openai/gpt-4o-mini", **extra}
    return Settings(
        database_url=f"sqlite:///{tmp_path / 's.db'}",
        output_dir=tmp_path / "outputs",
        summary_api_base=server.url,
        summary_api_key="sk-test",
        **chosen,
    )


def test_a_small_window_asks_for_a_summary_within_its_room_and_cuts_a_longer_answer(
    tmp_path: Path,
) -> None:
    """At a 4k window the summarizer is told the room (prompt and max_tokens), and a summary of
    about 1,800 tokens (44 % of the window) is cut to the room instead of being stored."""
    long_summary = "## Goal\n- the task\n## Done\n" + "\n".join(
        f"- step {i}: " + _words(25, f"s{i}_") for i in range(60)
    )
    server = LLMServer(default=lambda body: long_summary).start()
    try:
        recap = Recap(_settings(tmp_path, server), create_schema=True)
        cid = _conversation(recap, 4_000, 14)
        result = recap.compress(cid, force=True)
        assert result["action"] == "summarized", result
        sent = server.requests[-1].body
        asked = re.search(r"within about (\d+) tokens", sent["messages"][-1]["content"])
        assert asked is not None, (sent["messages"][-1]["content"][-500:], sent.get("max_tokens"))
        room = int(asked.group(1))
        assert room < 2_000 and sent["max_tokens"] <= room + room // 4
        (summary,) = recap.summaries(cid)
        assert summary.tokens <= room, (summary.tokens, room)
        assert count(long_summary) > room
    finally:
        server.stop()


def _refusing(window: int, stated: bool) -> Any:
    def refuse(body: dict[str, Any]) -> Reply | None:
        size = sum(count(str(m.get("content") or "")) + 4 for m in body.get("messages", []))
        if size + int(body.get("max_tokens") or 0) <= window:
            return None
        error = (
            f"This model's maximum context length is {window} tokens. However, you requested "
            f"{size + int(body.get('max_tokens') or 0)} tokens."
            if stated
            else "Input tokens exceed the configured limit."
        )
        return Reply(status=400, code="context_length_exceeded", error=error)

    return refuse


@pytest.mark.parametrize(("stated", "most_refused"), [(True, 1), (False, 2)])
def test_a_summarizer_that_refuses_long_input_is_refused_at_most_once_or_twice(
    tmp_path: Path, stated: bool, most_refused: int
) -> None:
    """A summary model no map knows (8,192 tokens assumed) whose real window is 6,000: where its
    error states the window the next request fits it; where not, the window halves (before, the
    chunks alone halved and it was refused 5 times at nearly the same size)."""
    server = LLMServer(refuse=_refusing(6_000, stated)).start()
    try:
        settings = _settings(tmp_path, server, summary_model="openai/local-unknown-model")
        recap = Recap(settings, create_schema=True)
        cid = _conversation(recap, 16_000, 40)
        result = recap.compress(cid, force=True)
        assert result["action"] == "summarized", result
        refused = [r for r in server.requests if _refusing(6_000, stated)(r.body) is not None]
        assert 1 <= len(refused) <= most_refused, len(refused)
    finally:
        server.stop()


def test_the_shorter_instruction_names_the_room() -> None:
    assert "{tokens}" in SHORTER


def test_stats_report_the_summary_in_use_and_the_cap(tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 's.db'}",
        output_dir=tmp_path / "outputs",
        summary_max_output_tokens=900,
    )
    recap = Recap(settings, create_schema=True)
    cid = _conversation(recap, 8_000, 16)
    assert (recap.stats(cid).summary_tokens, recap.stats(cid).summary_cap) == (0, 900)
    assert recap.compress(cid, force=True)["action"] == "summarized"
    (summary,) = recap.summaries(cid)
    stats = recap.stats(cid)
    assert stats.summary_tokens == summary.tokens <= 900
