"""`recap serve` answering a provider's context-length error: the size the error states is
recorded as a reading of the refused request (the calibration learns from it), and the request
is made smaller before it is sent again, or not sent again at all: the same request is never
resent. The stand-in provider counts by content (``tests.support.content_meter``) with a window
smaller than the one serve is given, so serve's first request overflows it.

A real serve process, the real openai SDK as the client, and the stand-in upstream on 127.0.0.1.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.content_meter import ContentMeter
from tests.support.llm_server import LLMServer
from tests.support.serving import SYSTEM, Serve, new_id, reply_to, running_serve, turn

SERVE_WINDOW = 3_000  # what serve is told
PROVIDER_WINDOW = 1_500  # what the stand-in provider accepts


@pytest.fixture(scope="module")
def metered() -> Iterator[LLMServer]:
    server = LLMServer(default=reply_to).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def serve(metered: LLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    folder: Path = tmp_path_factory.mktemp("serve-overflow")
    env = {"RECAP_SERVE_MAX_INPUT_TOKENS": str(SERVE_WINDOW)}
    with running_serve(f"sqlite:///{folder / 'recap.db'}", folder, metered, **env) as running:
        yield running


def prose(rng: random.Random, words: int) -> str:
    vocabulary = ["river", "stone", "lantern", "orchard", "harbor", "signal", "meadow", "copper"]
    return " ".join(rng.choice(vocabulary) for _ in range(words))


def bodies(serve: Serve, since: int) -> list[list[dict[str, Any]]]:
    """The conversation's requests since ``since`` (a summarizer's call is not one)."""
    sent = [list(r.body.get("messages") or []) for r in serve.llm.requests[since:]]
    return [messages for messages in sent if messages[:1] == [SYSTEM]]


def test_a_refused_request_that_cannot_shrink_is_not_sent_again(serve: Serve) -> None:
    """One message larger than the provider's window: nothing can be compressed or left out,
    so the provider's error reaches the client after one upstream call, and its stated size is
    recorded as the request's reading."""
    serve.llm.meter = ContentMeter(window=PROVIDER_WINDOW, seed=1)
    since = len(serve.llm.requests)
    cid = new_id()
    big = {"role": "user", "content": prose(random.Random(1), 2_000)}
    with pytest.raises(openai.BadRequestError) as caught:
        turn(serve, cid, [SYSTEM, big])
    assert caught.value.status_code == 400
    body: Any = caught.value.body
    assert (body.get("code") if isinstance(body, dict) else None) == "context_length_exceeded"
    assert len(bodies(serve, since)) == 1, "the refused request was sent again"
    stated = serve.llm.meter.requests[-1]
    assert [prompt for prompt, _ in serve.usage(cid)] == [stated]


@pytest.mark.parametrize("seed", [2, 3, 4])
def test_a_refused_request_is_sent_again_only_smaller(serve: Serve, seed: int) -> None:
    """Older turns under the smallest span worth summarizing and a large recent one: the
    retry leaves out what it must and fits, never resending the refused request."""
    rng = random.Random(seed)
    serve.llm.meter = ContentMeter(window=PROVIDER_WINDOW, seed=seed)
    cid = new_id()
    messages: list[dict[str, Any]] = [SYSTEM]
    serve.llm.meter.window = 10**6  # the early turns fit
    for n in range(5):
        messages.append({"role": "user", "content": f"question {n}: " + prose(rng, 55)})
        reply = turn(serve, cid, messages).parse()
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    serve.llm.meter.window = PROVIDER_WINDOW
    messages.append({"role": "user", "content": prose(rng, rng.randint(700, 780))})
    since, refused = len(serve.llm.requests), len(serve.llm.meter.over())
    reply = turn(serve, cid, messages)  # the smaller request fits
    assert reply.parse().choices[0].message.content
    sent = bodies(serve, since)
    assert len(sent) == 2 and sent[0] != sent[1], "the refused request was sent again unchanged"
    assert len(sent[1]) < len(sent[0])  # older turns left out (or summarized) to fit
    over = serve.llm.meter.over()
    assert len(over) == refused + 1
    prompts = [prompt for prompt, _ in serve.usage(cid)]
    assert over[-1] in prompts  # the refused request's stated size, as a reading
    assert int(reply.headers["X-Recap-Request-Tokens"]) < SERVE_WINDOW


def test_a_refusal_is_answered_once_in_each_apis_format(serve: Serve) -> None:
    """The same unshrinkable request, streamed on chat completions and sent on Messages: one
    upstream call each, and the provider's error in the client's own format."""
    import anthropic

    serve.llm.meter = ContentMeter(window=PROVIDER_WINDOW, seed=5)
    big = prose(random.Random(5), 2_000)
    since = len(serve.llm.requests)
    with pytest.raises(openai.BadRequestError):
        turn(serve, new_id(), [SYSTEM, {"role": "user", "content": big}], stream=True)
    assert len(bodies(serve, since)) == 1
    client = anthropic.Anthropic(
        base_url=serve.base_url.removesuffix("/v1"),
        api_key="client-key-aaaa-1111",
        max_retries=0,
        timeout=60,
        default_headers={"X-Recap-Conversation": new_id()},
    )
    since = len(serve.llm.requests)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model="openai/stand-in",
            max_tokens=50,
            system=SYSTEM["content"],
            messages=[{"role": "user", "content": big}],
        )
    body: Any = caught.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "resulted in" in body["error"]["message"]
    assert len(bodies(serve, since)) == 1
