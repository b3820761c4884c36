"""`recap serve` timed on real new turns, not only on repeats of one request.

A client's next request is its stored history plus one new message, and its reply is stored
after it; a repeat of the last request stores nothing. Both are timed here, to the first byte
of the streamed reply, in rounds that alternate them with calling the model server directly,
on a 200-message conversation, the model server answering at once in a process of its own:

- ``serve_new_turn_vs_repeat``: a new chat-completions turn (the history resent whole, one new
  user message, the reply stored) over a repeat of the same-sized request.
- ``serve_new_turn_vs_direct``: the new turn over calling the model server directly with the
  same messages (what ``serve_overhead_vs_direct`` reports for a repeat).
- ``serve_responses_new_turn_vs_direct``: a Responses API turn that sends only the new message
  and ``previous_response_id`` (Recap reads the branch and assembles it) over direct.
- ``serve_added_ms`` (p50) and ``serve_added_ms_p90``: what a new stored turn adds to the time
  to first byte of a model that takes ``SLOW_FIRST_BYTE`` seconds to its first byte (a second
  model server): per round, the new turn through `recap serve` less the same request sent
  directly.
- ``serve_ttfb_vs_litellm_proxy``: the new chat-completions turn (serve with its metrics on,
  ``RECAP_SERVE_METRICS=true``) over the LiteLLM proxy forwarding the same request to the same
  model server (``bench.litellm_proxy``: the proxy in
  an environment of its own, started as a process beside `recap serve` and timed in the same
  rounds); left out with the reason on stderr when it cannot be installed or started.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from bench import Figure
from bench.assemble import long_conversation
from bench.data import load_all
from bench.litellm_proxy import PROXY_KEY, litellm_proxy
from bench.serve import KEY, MODEL, REPLY, model_process, serve_process

CONVERSATION = 200  # messages of history each timed request carries
ROUNDS = 25  # timed rounds per side: odd (the median is one of them); five of each order of five
WARMUP_ROUNDS = 3  # untimed rounds: connections and caches warm up
NEW_TURN_BOUND = "<= 1.3"
PROXY_BOUND = "<= 0.5"
REQUEST_TIMEOUT = 120.0  # seconds one request may take
SLOW_FIRST_BYTE = 0.3  # seconds a real model commonly takes to its first byte
SLOW_ROUNDS = 11  # rounds against the slow model (each waits for it twice)


def run() -> list[Figure]:
    records = load_all()
    model = model_process()
    assert model.stdout is not None
    upstream = model.stdout.readline().decode().strip()
    try:
        with tempfile.TemporaryDirectory() as folder:
            root = Path(folder)
            database = f"sqlite:///{root / 'serve.db'}"
            # as an operator runs it: with its Prometheus metrics on
            with serve_process(database, upstream, root / "s", RECAP_SERVE_METRICS="true") as base:
                history = long_conversation(records, CONVERSATION)
                with litellm_proxy(MODEL, upstream, root) as proxy:
                    figures = rounds(base, upstream, proxy, history)
            slow, slow_url = slow_model()
            try:
                database = f"sqlite:///{root / 'slow.db'}"
                with serve_process(database, slow_url, root / "slow") as base:
                    figures += added(base, slow_url, history)
            finally:
                slow.terminate()
                slow.wait()
            return figures
    finally:
        model.terminate()
        model.wait()


def slow_model() -> tuple[subprocess.Popen[bytes], str]:
    """A model server taking ``SLOW_FIRST_BYTE`` seconds to its first byte; and its URL."""
    root = Path(__file__).resolve().parent.parent
    command = [sys.executable, "-m", "tests.support.llm_server", "--reply", REPLY]
    command += ["--delay", str(SLOW_FIRST_BYTE)]
    process = subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE)
    assert process.stdout is not None
    return process, process.stdout.readline().decode().strip()


def added(base: str, upstream: str, history: list[dict[str, Any]]) -> list[Figure]:
    """Milliseconds a new stored turn adds to a slow model's first byte, p50 and p90."""
    with httpx.Client(timeout=REQUEST_TIMEOUT) as client:
        sides = Sides(client, base, upstream, history)
        extra: list[float] = []
        for index in range(1 + SLOW_ROUNDS):  # the first round stores the history: untimed
            served = sides.new_turn()
            direct = sides.direct()
            if index:
                extra.append((served - direct) * 1000)
    extra.sort()
    p50 = statistics.median(extra)
    p90 = extra[min(len(extra) - 1, round(0.9 * (len(extra) - 1)))]
    where = f"a model taking {SLOW_FIRST_BYTE * 1000:.0f} ms to its first byte"
    return [
        Figure(
            "serve_added_ms",
            round(p50, 1),
            "",
            f"median milliseconds a new stored turn adds to the first byte of {where} "
            f"({CONVERSATION}+ messages; through recap serve less direct, per round)",
        ),
        Figure("serve_added_ms_p90", round(p90, 1), "", f"90th percentile of the same, {where}"),
    ]


def _first_byte(
    client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[float, bytes]:
    """Seconds until the first byte of the streamed reply, and the first chunk."""
    started = time.perf_counter()
    with client.stream("POST", url, json=body, headers=headers) as response:
        response.raise_for_status()
        stream = response.iter_raw()
        first = next(stream)
        elapsed = time.perf_counter() - started
        for _ in stream:
            pass
    return elapsed, first


def _response_id(first: bytes) -> str:
    """The response id of a Responses stream's first event (``response.created``)."""
    for line in first.decode().splitlines():
        if line.startswith("data: "):
            return str(json.loads(line[len("data: ") :])["response"]["id"])
    raise RuntimeError("the Responses stream did not start with response.created")


def as_items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as Responses input items: text messages, function calls, their outputs."""
    items: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] == "tool":
            output = {"call_id": message["tool_call_id"], "output": str(message["content"])}
            items.append({"type": "function_call_output", **output})
            continue
        if message.get("content"):
            items.append({"role": message["role"], "content": str(message["content"])})
        for call in message.get("tool_calls") or ():
            function = call["function"]
            items.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": function["name"],
                    "arguments": function["arguments"],
                }
            )
    return items


class Sides:
    """The requests timed each round; each keeps its own conversation."""

    def __init__(
        self, client: httpx.Client, base: str, upstream: str, history: list[dict[str, Any]]
    ) -> None:
        self.client, self.base, self.upstream = client, base, upstream
        self.auth = {"Authorization": f"Bearer {KEY}"}
        self.repeat = [*history]
        self.repeat_id = f"bench-repeat-{uuid.uuid4()}"
        self.growing = [*history]
        self.growing_id = f"bench-new-{uuid.uuid4()}"
        self.previous: str | None = None
        self.turn = 0

    def chat(self, url: str, messages: list[dict[str, Any]], cid: str | None) -> float:
        headers = {**self.auth, **({"X-Recap-Conversation": cid} if cid else {})}
        body = {"model": MODEL, "messages": messages, "stream": True}
        return _first_byte(self.client, url, body, headers)[0]

    def direct(self) -> float:
        body = {"model": MODEL.split("/", 1)[1], "messages": self.growing, "stream": True}
        return _first_byte(self.client, f"{self.upstream}/chat/completions", body, {})[0]

    def repeated(self) -> float:
        return self.chat(f"{self.base}/chat/completions", self.repeat, self.repeat_id)

    def new_turn(self) -> float:
        self.turn += 1
        # the history grows by the reply and one message per turn; the repeat is kept as long
        self.growing = [*self.growing, {"role": "user", "content": f"next step {self.turn}"}]
        elapsed = self.chat(f"{self.base}/chat/completions", self.growing, self.growing_id)
        self.growing.append({"role": "assistant", "content": REPLY})
        return elapsed

    def responses_turn(self) -> float:
        body: dict[str, Any] = {"model": MODEL, "stream": True, "input": f"go on {self.turn}"}
        if self.previous is None:
            body["input"] = as_items(self.repeat)
        else:
            body["previous_response_id"] = self.previous
        elapsed, first = _first_byte(self.client, f"{self.base}/responses", body, self.auth)
        self.previous = _response_id(first)
        return elapsed

    def proxied(self, proxy: str) -> Callable[[], float]:
        """The new turn's messages through the LiteLLM proxy (with the proxy's own key)."""
        headers = {"Authorization": f"Bearer {PROXY_KEY}"}

        def measure() -> float:
            body = {"model": MODEL, "messages": self.growing, "stream": True}
            return _first_byte(self.client, f"{proxy}/chat/completions", body, headers)[0]

        return measure


def timed_rounds(
    measures: Mapping[str, Callable[[], float]], rounds: int, warmup: int
) -> dict[str, list[float]]:
    """Each measure's times over ``rounds`` rounds after ``warmup`` untimed ones. Each round
    starts one later: every side follows every other equally often, so none is always the one
    that meets the work the side before it left running (a stored turn records its usage after
    its stream has ended); with two sides, they alternate which goes first."""
    times: dict[str, list[float]] = {name: [] for name in measures}
    names = list(measures)
    for index in range(warmup + rounds):
        turn = index % len(names)
        for name in names[turn:] + names[:turn]:
            elapsed = measures[name]()
            if index >= warmup:
                times[name].append(elapsed)
    return times


def rounds(
    base: str, upstream: str, proxy: str | None, history: list[dict[str, Any]]
) -> list[Figure]:
    with httpx.Client(timeout=REQUEST_TIMEOUT) as client:
        sides = Sides(client, base, upstream, history)
        measures: dict[str, Callable[[], float]] = {
            "direct": sides.direct,
            "new": sides.new_turn,
            "repeat": sides.repeated,
            "responses": sides.responses_turn,
        }
        if proxy is not None:
            measures["proxy"] = sides.proxied(proxy)
        times = timed_rounds(measures, ROUNDS, WARMUP_ROUNDS)
    ms = {name: statistics.median(values) * 1000 for name, values in times.items()}
    figures = [
        Figure(
            "serve_new_turn_vs_repeat",
            round(ms["new"] / ms["repeat"], 3),
            NEW_TURN_BOUND,
            f"time to first byte of a new stored turn ({ms['new']:.1f} ms: {CONVERSATION}+ "
            f"messages resent, one new, the reply stored) over a repeat of the last request "
            f"({ms['repeat']:.1f} ms, nothing stored); medians of alternating rounds",
        ),
        Figure("serve_new_turn_ttfb_ms", round(ms["new"], 2), "", "median, new stored turn"),
        Figure("serve_repeat_ttfb_ms", round(ms["repeat"], 2), "", "median, repeated request"),
        Figure(
            "serve_new_turn_vs_direct",
            round(ms["new"] / ms["direct"], 3),
            "",
            f"the new turn over calling the model server directly with the same messages "
            f"({ms['direct']:.1f} ms)",
        ),
        Figure(
            "serve_responses_new_turn_vs_direct",
            round(ms["responses"] / ms["direct"], 3),
            "",
            f"a Responses turn sending only the new message and previous_response_id "
            f"({ms['responses']:.1f} ms; Recap reads and assembles the branch) over direct",
        ),
    ]
    if proxy is not None:
        figures.append(
            Figure(
                "serve_ttfb_vs_litellm_proxy",
                round(ms["new"] / ms["proxy"], 3),
                PROXY_BOUND,
                f"the new stored turn through recap serve (metrics on) over the LiteLLM proxy "
                f"forwarding the same request ({ms['proxy']:.1f} ms), same rounds",
            )
        )
    return figures
