"""The summarizer's request on the chat's prefix through `recap serve` and a real worker: the
chat (system prompt, tools, turns) goes through serve to a stand-in provider that keeps a prompt
cache of the leading messages of the request before (``ContentMeter``); the summary model is the
chat's model at the same provider. The worker's summarizer request begins with the chat's last
request, messages and tools byte for byte, the provider reports that prefix as cached, and the
run's log row records it. Erasing the conversation erases the stored system prompt and tools.

On SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import inspect, select, text

from recap.core import service
from recap.core.settings import get_settings
from recap.core.storage.models import REQUEST_PROFILES, SUMMARIES, CompactionLog, table_of
from tests.support.cli_helpers import recap
from tests.support.content_meter import ContentMeter
from tests.support.llm_server import LLMServer, Recorded, stand_in_summary
from tests.support.serve_worker import database_url, serve_and_worker
from tests.support.serving import (
    Serve,
    as_message,
    reply_to,
    runs,
    turn,
    wait_until,
)

WINDOW = 3_000  # serve's window: six turns of 120 words go over the trigger
TURNS = 8
WORDS = 120
COMPACTION_LOG = table_of(CompactionLog)
MARK = "zqxprefixmark"  # in the system prompt and the tool schema only
SYSTEM = {"role": "system", "content": f"You are a careful assistant ({MARK})."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": f"Look a word up ({MARK}).",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }
]


def answer(body: dict[str, Any]) -> str:
    """The chat's reply, or the summary when the request is the summarizer's."""
    last = body.get("messages", [])[-1:] or [{}]
    if "CUTOFF" in str(last[0].get("content") or ""):
        return stand_in_summary(body)[:1_500]
    return reply_to(body)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Serve, LLMServer]]:
    """Serve and its worker; one stand-in provider answers the chat and the summarizer."""
    tmp_path = tmp_path_factory.mktemp("onprefix-worker")
    provider = LLMServer(default=answer, meter=ContentMeter(window=100_000)).start()
    try:
        with (
            database_url(request, tmp_path) as url,
            serve_and_worker(url, tmp_path, provider, provider, WINDOW) as serve,
        ):
            yield serve, provider
    finally:
        provider.stop()


def summarizer_calls(provider: LLMServer) -> list[Recorded]:
    return [r for r in provider.requests if "CUTOFF" in str(r.messages[-1].get("content"))]


def serialized(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)  # key order kept: byte for byte as parsed


def test_the_summarizer_request_begins_with_the_chats_last_request_and_erasure_takes_its_prefix(
    stack: tuple[Serve, LLMServer],
) -> None:
    serve, provider = stack
    cid = "onprefix-chat"
    messages: list[dict[str, Any]] = [SYSTEM]
    for n in range(TURNS):  # a turn at a time, its run done before the next (a person's pace)
        before = runs(serve, cid)
        words = " ".join(f"w{n}x{i}" for i in range(WORDS))
        messages.append({"role": "user", "content": f"turn {n} about item_{n}.py: {words}"})
        messages.append(as_message(turn(serve, cid, messages, tools=TOOLS).parse()))
        wait_until(lambda b=before: runs(serve, cid) > b, what=f"the run after turn {n}")
        if summarizer_calls(provider):
            break
    assert summarizer_calls(provider), "no run summarized"
    wait_until(lambda: _summaries(serve, cid) >= 1, what="a stored summary")

    call = summarizer_calls(provider)[0]
    at = provider.requests.index(call)
    chat = provider.requests[at - 1]  # the chat's last request before the summarizer's
    assert "CUTOFF" not in chat.text
    shared = call.messages[: len(chat.messages)]
    assert serialized(shared) == serialized(chat.messages)  # system and leading messages
    assert chat.messages[0]["content"] == SYSTEM["content"]
    assert serialized(call.body["tools"]) == serialized(chat.body["tools"])
    assert MARK in serialized(call.body["tools"])
    assert len(call.messages) == len(chat.messages) + 1  # then the instruction alone
    assert call.body.get("prompt_cache_key") == chat.body.get("prompt_cache_key")

    with serve.engine.connect() as connection:
        log = COMPACTION_LOG.c
        cached = connection.execute(
            select(log.cached_input_tokens, log.input_tokens).where(
                log.conversation_id == cid, log.action == "summarized"
            )
        ).first()
        stored = connection.execute(
            select(REQUEST_PROFILES.c.sent_spec).where(REQUEST_PROFILES.c.conversation_id == cid)
        ).scalar_one()
    assert cached is not None and 0 < cached[0] <= cached[1]  # the provider read it from cache
    assert cached[0] / cached[1] > 0.7
    assert MARK in stored and "lookup" in stored
    stats = service.conversation_stats(serve.engine, cid, get_settings())
    assert stats.summarizer_cached_tokens == cached[0]  # what `recap stats` shows
    assert stats.summarizer_cache_share is not None and stats.summarizer_cache_share > 0.7

    assert recap("delete", cid, "--yes").code == 0
    assert _rows_naming(serve, MARK) == []  # erased means gone: no table holds the prefix


def _summaries(serve: Serve, cid: str) -> int:
    with serve.engine.connect() as connection:
        rows = connection.execute(select(SUMMARIES.c.id).where(SUMMARIES.c.conversation_id == cid))
        return len(rows.all())


def _rows_naming(serve: Serve, needle: str) -> list[str]:
    """Every table (name) with a row whose text holds ``needle``."""
    found = []
    with serve.engine.connect() as connection:
        for table in inspect(connection).get_table_names():
            for row in connection.execute(text(f'SELECT * FROM "{table}"')):
                if needle in str(tuple(row)):
                    found.append(table)
                    break
    return found
