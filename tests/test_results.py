"""The host API's typed results: attributes for type checkers, and the dict shape of before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recap.core.client import Recap
from recap.core.results import (
    CompressResult,
    ExportedConversation,
    Stats,
    SummaryInfo,
    UsageRecorded,
)
from recap.core.settings import Settings


@pytest.fixture
def recap(tmp_path: Path) -> Recap:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'r.db'}", output_dir=tmp_path / "outputs"
    )
    return Recap(settings, create_schema=True)


def test_each_result_is_typed_and_reads_as_its_dict(recap: Recap) -> None:
    """stats, record_usage, compress, export and summaries return dataclasses whose mapping view
    is the JSON object the CLI prints."""
    cid = recap.new(max_input_tokens=4_000)
    recap.add(cid, {"role": "user", "content": "hello there"})
    stats = recap.stats(cid)
    usage = recap.record_usage(cid, prompt_tokens=20)
    done = recap.compress(cid)
    exported = recap.export(cid)
    assert isinstance(stats, Stats) and stats["window"] == stats.window
    assert isinstance(usage, UsageRecorded) and usage.measured == 20 == usage["measured"]
    assert isinstance(done, CompressResult) and done.action == "skipped"
    assert isinstance(exported, ExportedConversation) and exported.id == cid
    assert recap.summaries(cid) == []
    for result in (stats, usage, done, exported):
        assert dict(result) == result.as_dict() == json.loads(json.dumps(result.as_dict()))
        assert result == result.as_dict()
    assert exported["messages"][0]["content"] == "hello there"


@pytest.mark.parametrize(
    ("key", "present"),
    [("action", True), ("reason", True), ("summary_id", True), ("model", False)],
)
def test_compress_result_keys(key: str, present: bool) -> None:
    """The compress result holds the contract's keys and nothing the log row keeps."""
    payload = {"action": "skipped", "reason": "under", "tokens_before": 1, "tokens_after": 1}
    assert (key in CompressResult.of(payload)) is present


def test_summary_info_fields() -> None:
    """A summary's row is read by attribute and by key alike; unknown keys are KeyError."""
    row = SummaryInfo(
        id=1,
        cutoff_message_id=5,
        previous_summary_id=None,
        tokens=40,
        model="m",
        identifier_retention=0.5,
        created_at="2026-01-01T00:00:00",
    )
    assert row.tokens == row["tokens"] == 40
    with pytest.raises(KeyError):
        row["nope"]


def test_the_host_handles_take_what_the_cli_takes(recap: Recap) -> None:
    """``Recap.assemble`` and ``AsyncRecap.assemble`` take the window and the model like
    ``recap assemble --max-input-tokens/--model``, and answer as the service does."""
    import asyncio

    from recap.core import service
    from recap.core.aio import AsyncRecap

    cid = recap.new(max_input_tokens=100_000)
    for n in range(30):
        recap.add(
            cid, {"role": "user" if n % 2 == 0 else "assistant", "content": f"turn {n} " * 40}
        )
    tight = recap.assemble(cid, max_input_tokens=1_500)
    other = recap.assemble(cid, model="gpt-3.5-turbo", max_input_tokens=1_500)
    wide = recap.assemble(cid)
    assert tight.truncated and not wide.truncated
    assert tight.budget < wide.budget and tight.budget == other.budget
    assert (
        tight.as_dict()
        == service.assemble(recap.engine, cid, recap.settings, max_input_tokens=1_500).as_dict()
    )

    async def through_the_loop() -> dict[str, object]:
        async with AsyncRecap(recap) as handle:
            request = await handle.assemble(cid, max_input_tokens=1_500)
            return request.as_dict()

    assert asyncio.run(through_the_loop()) == tight.as_dict()
