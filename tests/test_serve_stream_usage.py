"""`recap serve` calibrates streamed turns as it does plain ones, on each of its three APIs
(chat completions, Responses, Messages): every request's usage, as the provider reported it at
the stream's end (``stream_options.include_usage`` upstream), is recorded against what was sent,
its cached share included. The stand-in provider counts by content and reports a prompt cache
(``tests.support.content_meter``), so the recorded figures can be checked against its own.

A real serve process, the real openai and anthropic SDKs, and the stand-in upstream on 127.0.0.1.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from sqlalchemy import select

from tests.support.content_meter import ContentMeter
from tests.support.llm_server import LLMServer
from tests.support.serving import (
    KEY_A,
    MODEL,
    USAGE,
    Serve,
    new_id,
    reply_to,
    running_serve,
    wait_until,
)


@pytest.fixture(scope="module")
def metered() -> Iterator[LLMServer]:
    server = LLMServer(default=reply_to, meter=ContentMeter(window=10**6, seed=7)).start()
    yield server
    server.stop()


@pytest.fixture(scope="module", params=["direct", "litellm"])
def serve(
    request: pytest.FixtureRequest, metered: LLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Serve]:
    """Both upstream paths: the direct one and litellm's, whose chunks are converted."""
    folder: Path = tmp_path_factory.mktemp("serve-stream-usage")
    env = {"RECAP_UPSTREAM_CLIENT": request.param}
    with running_serve(f"sqlite:///{folder / 'recap.db'}", folder, metered, **env) as running:
        yield running


def usage_rows(serve: Serve, cid: str) -> list[tuple[int, int, int]]:
    u = USAGE.c
    statement = (
        select(u.prompt_tokens, u.completion_tokens, u.cached_tokens)
        .where(u.conversation_id == cid)
        .order_by(u.id)
    )
    with serve.engine.connect() as connection:
        return [(int(a), int(b), int(c or 0)) for a, b, c in connection.execute(statement)]


def chat_stream(serve: Serve, cid: str, text: str, history: list[Any]) -> str:
    history.append({"role": "user", "content": text})
    stream = serve.client().chat.completions.create(
        model=MODEL, messages=history, stream=True, extra_headers={"X-Recap-Conversation": cid}
    )
    reply = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    history.append({"role": "assistant", "content": reply})
    return reply


def responses_stream(serve: Serve, cid: str, text: str, history: list[Any]) -> str:
    history.append({"role": "user", "content": text})
    stream = serve.client().responses.create(
        model=MODEL, input=history, stream=True, extra_headers={"X-Recap-Conversation": cid}
    )
    reply = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
    history.append({"role": "assistant", "content": reply})
    return reply


def messages_stream(serve: Serve, cid: str, text: str, history: list[Any]) -> str:
    history.append({"role": "user", "content": text})
    client = anthropic.Anthropic(
        base_url=serve.base_url.removesuffix("/v1"),
        api_key=KEY_A,
        max_retries=0,
        timeout=60,
        default_headers={"X-Recap-Conversation": cid},
    )
    with client.messages.stream(model=MODEL, max_tokens=100, messages=history) as stream:
        reply = "".join(stream.text_stream)
    history.append({"role": "assistant", "content": reply})
    return reply


@pytest.mark.parametrize("api", [chat_stream, responses_stream, messages_stream])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_streamed_request_is_recorded_with_the_providers_usage(
    serve: Serve, api: Any, seed: int
) -> None:
    rng = random.Random(seed)
    cid = new_id()
    meter = serve.llm.meter
    history: list[Any] = []
    counts: list[int] = []
    for n in range(rng.randint(2, 4)):
        before = len(meter.requests)
        text = f"turn {n}: " + " ".join(rng.choice(["alpha", "beta", "{x: 1}"]) for _ in range(30))
        assert api(serve, cid, text, history)
        assert len(meter.requests) == before + 1
        counts.append(meter.requests[-1])
        wait_until(lambda: len(usage_rows(serve, cid)) >= len(counts), "the usage recorded")
    rows = usage_rows(serve, cid)
    assert [prompt for prompt, _, _ in rows] == counts
    assert all(completion > 0 for _, completion, _ in rows)
    assert all(cached > 0 for _, _, cached in rows[1:])  # the prompt cache is recorded
