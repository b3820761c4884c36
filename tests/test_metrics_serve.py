"""`recap serve` with RECAP_SERVE_METRICS=true: ``GET /metrics`` after real turns (stored,
truncated, streamed, passed through, refused) says each one's value: requests by API and
status, the request tokens Recap assembled (what X-Recap-Request-Tokens said), the truncated
turn and the tokens it left out (what the truncation line logged), the upstream's time against
its scripted delays, and the time serve added; the key guards the page; off, there is none.

A real serve process, the real openai SDK, and the stand-in upstream on 127.0.0.1.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from recap.core.settings import Settings
from recap.workers.serve.app import create_app
from tests.support.llm_server import LLMServer, Reply
from tests.support.serving import Serve, new_id, running_serve, turn, wait_until

METRICS_KEY = "metrics-key-0123456789"
DELAY = 0.3  # the upstream's scripted delay before its answer


@pytest.fixture(scope="module")
def serve(llm: LLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    folder: Path = tmp_path_factory.mktemp("serve-metrics")
    env = {"RECAP_SERVE_METRICS": "true", "RECAP_SERVE_METRICS_KEY": METRICS_KEY}
    with running_serve(f"sqlite:///{folder / 'recap.db'}", folder, llm, **env) as running:
        yield running


def root(serve: Serve) -> str:
    return serve.base_url.removesuffix("/v1")


def scrape(serve: Serve) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics``: (name, sorted labels) -> value."""
    response = httpx.get(
        root(serve) + "/metrics", headers={"Authorization": f"Bearer {METRICS_KEY}"}, timeout=10
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def long_history() -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = []
    for n in range(60):
        words = " ".join(f"t{n}w{i}" for i in range(60))
        history += [
            {"role": "user", "content": f"q{n} {words}"},
            {"role": "assistant", "content": f"a{n} {words}"},
        ]
    return [*history, {"role": "user", "content": "and now?"}]


def left_out_logged(serve: Serve, cid: str) -> int:
    """The tokens the truncation line of the conversation says were left out."""
    for line in serve.log.read_text().splitlines():
        if cid in line and "assemble_truncated" in line:
            return int(json.loads(line)["tokens"])
    raise AssertionError(f"no truncation line for {cid}")


def test_metrics_page_needs_its_key(serve: Serve) -> None:
    url = root(serve) + "/metrics"
    assert httpx.get(url, timeout=10).status_code == 401
    wrong = httpx.get(url, headers={"Authorization": "Bearer nope"}, timeout=10)
    assert wrong.status_code == 401
    assert "recap_serve" not in wrong.text


def test_each_metric_counts_the_turns_it_saw(serve: Serve) -> None:
    before = scrape(serve)
    serve.llm.script(Reply(delay=DELAY))
    short = turn(serve, new_id(), [{"role": "user", "content": "short"}])
    assert short.headers["x-recap-truncated"] == "false"
    cid = new_id()
    serve.llm.script(Reply(delay=DELAY))
    long = turn(serve, cid, long_history())
    assert long.headers["x-recap-truncated"] == "true"
    serve.llm.script(Reply(chunk_delay=0.05))
    streamed = turn(serve, new_id(), [{"role": "user", "content": "stream"}], stream=True)
    chunks = list(streamed.parse())
    assert chunks
    turn(serve, None, [{"role": "user", "content": "passed through"}])  # no conversation
    with pytest.raises(openai.AuthenticationError):
        turn(serve, new_id(), [{"role": "user", "content": "x"}], key="not-a-key")
    wait_until(lambda: cid in serve.log.read_text(), what="the truncation logged")
    after = scrape(serve)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("recap_serve_requests_total", api="chat_completions", status="200") == 4
    assert grew("recap_serve_requests_total", api="chat_completions", status="401") == 1
    assert grew("recap_serve_turns_total") == 3
    tokens = [int(r.headers["x-recap-request-tokens"]) for r in (short, long, streamed)]
    assert grew("recap_serve_request_tokens_count") == 3
    assert grew("recap_serve_request_tokens_sum") == sum(tokens)
    assert grew("recap_serve_truncated_turns_total") == 1
    left_out = left_out_logged(serve, cid)
    assert left_out > 0
    assert grew("recap_serve_left_out_tokens_total") == left_out
    # four upstream calls (three turns and the pass-through); two waited DELAY before answering
    assert grew("recap_serve_upstream_first_byte_seconds_count") == 4
    assert grew("recap_serve_upstream_seconds_count") == 4
    first = grew("recap_serve_upstream_first_byte_seconds_sum")
    total = grew("recap_serve_upstream_seconds_sum")
    assert 2 * DELAY <= first < 2 * DELAY + 5
    assert total >= first  # the stream's total runs to its last chunk
    assert grew("recap_serve_added_seconds_count") == 4
    added = grew("recap_serve_added_seconds_sum")
    assert 0 < added < 5  # serve's own time, the upstream's delays excluded
    assert grew("recap_serve_recalls_answered_total") == 0  # recall is off here


def test_metrics_are_off_by_default(tmp_path: Path) -> None:
    """Without RECAP_SERVE_METRICS there is no /metrics (a 404 in the API's format)."""
    settings = Settings(
        serve_keys=("k-0123456789",),
        database_url=f"sqlite:///{tmp_path / 'recap.db'}",
    )
    client = TestClient(create_app(settings))
    response = client.get("/metrics")
    assert response.status_code == 404
    assert "error" in response.json()


@pytest.fixture(scope="module")
def recalling(llm: LLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    folder: Path = tmp_path_factory.mktemp("serve-metrics-recall")
    env = {
        "RECAP_SERVE_METRICS": "true",
        "RECAP_SERVE_METRICS_KEY": METRICS_KEY,
        "RECAP_SERVE_RECALL": "true",
    }
    with running_serve(f"sqlite:///{folder / 'recap.db'}", folder, llm, **env) as running:
        yield running


def test_recalls_answered_and_each_upstream_round_are_counted(recalling: Serve) -> None:
    """A turn whose model calls recap_recall twice, in two rounds: two recalls answered, three
    upstream calls (timed), one request."""
    from tests.test_serve_recall import TOOLS, _cleared_history, recall_call

    cid = new_id()
    messages, result_id = _cleared_history(recalling, cid)
    messages.append({"role": "user", "content": "which module has handler_42?"})
    before = scrape(recalling)
    recalling.llm.script(
        Reply(text="", tool_calls=[recall_call("rc_1", f"m{result_id}")]),
        Reply(text="", tool_calls=[recall_call("rc_2", f"m{result_id}")]),
    )
    calls = len(recalling.llm.requests)
    reply = turn(recalling, cid, messages, tools=TOOLS).parse()
    assert not reply.choices[0].message.tool_calls
    assert len(recalling.llm.requests) - calls == 3
    after = scrape(recalling)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("recap_serve_recalls_answered_total") == 2
    assert grew("recap_serve_requests_total", api="chat_completions", status="200") == 1
    assert grew("recap_serve_upstream_first_byte_seconds_count") == 1  # a request's calls summed
    assert grew("recap_serve_turns_total") == 1
