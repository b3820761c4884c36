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


# --- the placeholder of a cleared result names the recall tool the request offers ---------------


def test_the_placeholder_names_recap_recall_when_the_request_offers_it(serve: Serve) -> None:
    """A cleared output's placeholder, as serve sends it with RECAP_SERVE_RECALL, says to call
    recap_recall with its ref, never to run the tool again."""
    from tests.support.serving import turn
    from tests.test_serve_recall import TOOLS as CHAT_TOOLS
    from tests.test_serve_recall import _cleared_history

    cid = new_id()
    messages, result_id = _cleared_history(serve, cid)
    messages.append({"role": "user", "content": "which module has handler_42?"})
    before = len(serve.llm.requests)
    turn(serve, cid, messages, tools=CHAT_TOOLS).parse()
    asked = serve.llm.requests[before].body
    placeholder = next(m["content"] for m in asked["messages"] if m["role"] == "tool")
    assert f"ref=m{result_id}" in placeholder
    assert "recap_recall" in placeholder and "run the tool again" not in placeholder.lower()


@pytest.mark.parametrize("seed", range(4))
def test_placeholder_bytes_without_recall_and_the_bound_with_it(seed: int) -> None:
    """Without the recall tool the placeholder is the plain wording (the same bytes as ever);
    with it, every wording stays within the token bound the clearing planned with."""
    from recap.core.counting import tokens
    from recap.core.decision.toolresults import placeholder_tokens_bound
    from recap.core.request.placeholders import cleared_placeholder

    rng = random.Random(seed)
    for _ in range(50):
        path = rng.choice([None, f"/out/{rng.randint(0, 10**6)}.txt"])
        parts: dict[str, Any] = {
            "tool_name": rng.choice([None, "grep", "read_file"]),
            "call_id": f"call_{rng.randint(0, 10**6)}",
            "tokens": rng.randint(1, 10**5),
            "output_path": path,
            "file_exists": rng.random() < 0.5,
            "ref": f"m{rng.randint(1, 10**6)}",
        }
        plain = cleared_placeholder(**parts)
        assert "recap_recall" not in plain
        assert cleared_placeholder(**parts, recall=False) == plain
        named = cleared_placeholder(**parts, recall=True)
        if not (path and parts["file_exists"]):
            assert "recap_recall" in named
        bound = placeholder_tokens_bound(
            tool_name=parts["tool_name"],
            call_id=parts["call_id"],
            tokens=parts["tokens"],
            output_path=path,
        )
        for text in (plain, named):
            message = {"role": "tool", "content": text, "tool_call_id": parts["call_id"]}
            if parts["tool_name"]:
                message["name"] = parts["tool_name"]
            for encoding in (tokens.O200K, tokens.CL100K):
                assert tokens.count_message(message, encoding) <= bound


def test_a_streamed_turn_without_the_tool_keeps_the_plain_placeholder(serve: Serve) -> None:
    """A streamed turn goes out without recap_recall, so its placeholder says the plain
    wording: it never names a tool the request does not carry."""
    from tests.support.serving import turn
    from tests.test_serve_recall import TOOLS as CHAT_TOOLS
    from tests.test_serve_recall import _cleared_history

    cid = new_id()
    messages, _ = _cleared_history(serve, cid)
    messages.append({"role": "user", "content": "which module has handler_7?"})
    before = len(serve.llm.requests)
    stream = turn(serve, cid, messages, tools=CHAT_TOOLS, stream=True).parse()
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    asked = serve.llm.requests[before].body
    assert [t["function"]["name"] for t in asked["tools"]] == ["grep"]
    placeholder = next(m["content"] for m in asked["messages"] if m["role"] == "tool")
    assert "recap_recall" not in placeholder and "Run the tool again" in placeholder
