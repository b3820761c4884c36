"""`recap serve` with RECAP_SERVE_RECALL=true counts what it sends: Messages ``count_tokens``
includes the ``recap_recall`` tool a ``/v1/messages`` turn carries, so the count equals the
turn's ``X-Recap-Request-Tokens``, for a new conversation and for a stored one.

A real serve process, the real anthropic SDK as the client, and the stand-in upstream on 127.0.0.1.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.support.llm_server import LLMServer
from tests.support.serving import MODEL, Serve, new_id, running_serve

TOOLS = [{"name": "grep", "description": "search", "input_schema": {"type": "object"}}]


@pytest.fixture(scope="module")
def serve(llm: LLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    folder: Path = tmp_path_factory.mktemp("serve-recall-counts")
    env = {"RECAP_SERVE_RECALL": "true"}
    with running_serve(f"sqlite:///{folder / 'recap.db'}", folder, llm, **env) as running:
        yield running


def client(serve: Serve, cid: str | None = None) -> anthropic.Anthropic:
    headers = {"X-Recap-Conversation": cid} if cid else None
    return anthropic.Anthropic(
        base_url=serve.base_url.removesuffix("/v1"),
        api_key="client-key-aaaa-1111",
        max_retries=0,
        timeout=60,
        default_headers=headers,
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_count_tokens_counts_the_recall_tool(serve: Serve, seed: int) -> None:
    rng = random.Random(seed)
    cid = new_id()
    tools: Any = TOOLS if rng.random() < 0.5 else anthropic.NOT_GIVEN
    history: list[Any] = []
    for n in range(rng.randint(1, 4)):
        words = " ".join(f"w{rng.randint(0, 999)}" for _ in range(rng.randint(3, 40)))
        history.append({"role": "user", "content": f"q{n} {words}"})
        counted = client(serve, cid).messages.count_tokens(
            model=MODEL, messages=history, tools=tools
        )
        raw = client(serve, cid).messages.with_raw_response.create(
            model=MODEL, max_tokens=50, messages=history, tools=tools
        )
        assert counted.input_tokens == int(raw.headers["x-recap-request-tokens"])
        history.append({"role": "assistant", "content": raw.parse().content[0].text})  # type: ignore[union-attr]
