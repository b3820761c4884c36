"""`recap serve` in front of a model: its added latency and its throughput.

The local model server runs in a process of its own and answers at once, so every millisecond
measured is Recap's (and the HTTP hops'), not a model's. `recap serve` runs as a real process.

- ``serve_overhead_vs_direct``: time to first byte of a streamed reply through `recap serve`
  over time to first byte calling the model server directly, for the same 200-message
  conversation (stored on the first request; each timed request resends it whole, as an OpenAI
  client does: it is mapped onto the stored tree, assembled, sent upstream and streamed back).
  Medians of rounds that alternate the two, so load on the machine falls on both alike. The
  absolute medians are reported beside it. `recap serve` runs with its default client path:
  an ``openai/`` model with ``RECAP_UPSTREAM_API_BASE`` set goes out on its direct HTTP client.
- ``litellm_overhead_vs_direct``: what the other path would cost. The same request sent by
  litellm alone (``litellm.acompletion``, configured as `recap serve` configures it for
  ``RECAP_UPSTREAM_CLIENT=litellm``, from this process, nothing stored or assembled) to its
  first streamed chunk, over calling the model server directly; measured in the same
  alternating rounds. With litellm on the path, serve's ratio could not fall below this one.
- ``passthrough_overhead_vs_direct``: the floor of any proxy on serve's stack: ``bench.passthrough``
  (Starlette under uvicorn, a pooled httpx client) parses the body, serializes it again and
  streams the reply back, nothing else, measured in the same rounds; and
  ``serve_overhead_vs_passthrough``, what Recap's own work adds on top of that second hop.
- ``lean_passthrough_overhead_vs_direct``: the same for ``bench.passthrough --lean`` (orjson and
  one aiohttp session on the same server): the least any Python proxy in front of the model
  costs here, measured in the same rounds. ``serve_overhead_vs_direct`` cannot fall below it.
- ``serve_requests_per_second`` (SQLite) and ``serve_requests_per_second_postgres``: stored,
  non-streaming turns completed per second by 16 concurrent clients, each resending its own
  growing conversation. Reported, not bounded: it depends on the machine's cores.
- ``litellm_proxy_requests_per_second``: the same clients through the LiteLLM proxy
  (``bench.litellm_proxy``: its own environment, one worker, its defaults; nothing stored) to
  the same model server, in the same run; left out with the reason on stderr when the proxy
  cannot be installed or started here.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench import Figure
from bench.add import _postgres_database
from bench.assemble import long_conversation
from bench.data import load_all
from bench.litellm_proxy import litellm_proxy

KEY = "bench-client-key-0001"
MODEL = "openai/stand-in"
CONVERSATION = 200  # messages resent by each timed request
ROUNDS = 31  # timed rounds per side; the median of an odd count is one of them
WARMUP_ROUNDS = 3  # untimed rounds: connections, statement caches and litellm warm up
CLIENTS = 16  # concurrent clients for the throughput figure
TURNS_PER_CLIENT = 8  # stored turns each client sends
START_HISTORY = 20  # messages each throughput conversation starts with
START_TIMEOUT = 120.0  # seconds for a serve process to answer its health check
REQUEST_TIMEOUT = 120.0  # seconds one request may take under load
WINDOW = 1_000_000  # serve's window for the stand-in model: no request is cut
REPLY = "Done: the tests pass now, and the change is in src/app.py."


def run() -> list[Figure]:
    records = load_all()
    model = model_process()
    assert model.stdout is not None
    upstream = model.stdout.readline().decode().strip()
    try:
        with tempfile.TemporaryDirectory() as folder:
            root = Path(folder)
            sqlite = f"sqlite:///{root / 'serve.db'}"
            with (
                serve_process(sqlite, upstream, root / "sqlite") as base,
                passthrough_process(upstream) as floor,
                passthrough_process(upstream, lean=True) as lean,
            ):
                messages = long_conversation(records, CONVERSATION)
                figures = overhead(base, upstream, (floor, lean), messages)
                figures.append(throughput(base, records, ""))
                with litellm_proxy(MODEL, upstream, root) as proxy:
                    if proxy is not None:
                        figures.append(proxy_throughput(proxy, records))
            database = _postgres_database()
            if database is None:
                print(
                    "bench.serve: PostgreSQL not reachable, its figure is left out", file=sys.stderr
                )
                return figures
            url, drop = database
            try:
                with serve_process(url, upstream, root / "postgres") as base:
                    figures.append(throughput(base, records, "_postgres"))
            finally:
                drop()
    finally:
        model.terminate()
        model.wait()
    return figures


def model_process() -> subprocess.Popen[bytes]:
    """The local model server in a process of its own, answering every request at once with a
    fixed short text; its first output line is its URL."""
    root = Path(__file__).resolve().parent.parent
    command = [sys.executable, "-m", "tests.support.llm_server", "--reply", REPLY]
    return subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE)


@contextmanager
def serve_process(url: str, upstream: str, folder: Path, **extra: str) -> Iterator[str]:
    """`recap serve` on a migrated ``url`` (``extra``: more ``RECAP_*`` values); its base URL
    (``.../v1``)."""
    from recap.core.storage.db import make_engine
    from recap.core.storage.migrate import upgrade
    from tests.support.serve_stack import serve_process as started

    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    env = {
        "RECAP_DATABASE_URL": url,
        "RECAP_SERVE_KEYS": KEY,
        "RECAP_UPSTREAM_API_BASE": upstream,
        "RECAP_UPSTREAM_API_KEY": "bench-upstream-key",
        "RECAP_UPSTREAM_CLIENT": "auto",  # the default: direct for this openai/ model
        "RECAP_SERVE_MAX_INPUT_TOKENS": str(WINDOW),
        "RECAP_BROKER_FOLDER": str(folder / "broker"),
        "RECAP_OUTPUT_DIR": str(folder / "outputs"),
        "RECAP_LOG_LEVEL": "WARNING",
        **extra,
    }
    with started(env, folder, START_TIMEOUT) as process:
        yield process.base_url


@contextmanager
def passthrough_process(upstream: str, *, lean: bool = False) -> Iterator[str]:
    """``bench.passthrough`` (a bare proxy on serve's stack; with ``lean``, its orjson and
    aiohttp variant) on a free port; its base URL."""
    from tests.support.processes import free_port, stop_group, wait_for

    port = free_port()
    command = [sys.executable, "-m", "bench.passthrough", upstream, str(port)]
    command += ["--lean"] if lean else []
    process = subprocess.Popen(command, start_new_session=True)

    def healthy() -> bool:
        if process.poll() is not None:
            raise RuntimeError("the pass-through proxy exited")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, START_TIMEOUT, "the pass-through proxy")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        stop_group(process)


def _first_byte(
    client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]
) -> float:
    """Seconds until the first byte of the streamed reply (then the rest is read)."""
    started = time.perf_counter()
    with client.stream("POST", url, json=body, headers=headers) as response:
        response.raise_for_status()
        stream = response.iter_raw()
        next(stream)
        elapsed = time.perf_counter() - started
        for _ in stream:
            pass
    return elapsed


class LitellmAlone:
    """``workers.serve.via_litellm.complete`` (litellm, as `recap serve` configures it) on an event
    loop of its own, kept for every call so that litellm's cached client is reused."""

    def __init__(self, upstream: str, messages: list[dict[str, Any]]) -> None:
        from recap.core.settings import Settings

        self.settings = Settings(upstream_api_base=upstream, upstream_api_key="bench-upstream-key")
        self.messages = messages
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def first_chunk(self) -> float:
        """Seconds until litellm yields the first streamed chunk (then the rest is read)."""
        return asyncio.run_coroutine_threadsafe(self._first_chunk(), self.loop).result()

    async def _first_chunk(self) -> float:
        from recap.workers.serve import via_litellm

        started = time.perf_counter()
        stream = await via_litellm.complete(MODEL, self.messages, {}, self.settings, stream=True)
        chunks = stream.__aiter__()
        await chunks.__anext__()
        elapsed = time.perf_counter() - started
        async for _ in chunks:
            pass
        return elapsed

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


def overhead(
    base: str, upstream: str, floors: tuple[str, str], messages: list[dict[str, Any]]
) -> list[Figure]:
    """The time-to-first-byte ratio, and both medians in milliseconds; litellm's own ratio; the
    bare proxy's ratio (the floor of any proxy on this stack) and the lean proxy's."""
    floor, lean_floor = floors
    body = {"model": MODEL, "messages": messages, "stream": True}
    direct_body = {**body, "model": MODEL.split("/", 1)[1]}
    served = {"Authorization": f"Bearer {KEY}", "X-Recap-Conversation": f"bench-{uuid.uuid4()}"}
    litellm_alone = LitellmAlone(upstream, messages)
    try:
        with httpx.Client(timeout=REQUEST_TIMEOUT) as client:
            sides: dict[str, Callable[[], float]] = {  # timed in this order in every round
                "direct": lambda: _first_byte(
                    client, f"{upstream}/chat/completions", direct_body, {}
                ),
                "serve": lambda: _first_byte(client, f"{base}/chat/completions", body, served),
                "litellm": litellm_alone.first_chunk,
                "bare": lambda: _first_byte(client, f"{floor}/chat/completions", body, {}),
                "lean": lambda: _first_byte(client, f"{lean_floor}/chat/completions", body, {}),
            }
            times: dict[str, list[float]] = {name: [] for name in sides}
            for index in range(WARMUP_ROUNDS + ROUNDS):
                for name, measure in sides.items():
                    elapsed = measure()
                    if index >= WARMUP_ROUNDS:
                        times[name].append(elapsed)
    finally:
        litellm_alone.close()
    direct_ms, serve_ms, litellm_ms, floor_ms, lean_ms = (
        statistics.median(times[name]) * 1000 for name in sides
    )
    return [
        Figure(
            "serve_overhead_vs_direct",
            round(serve_ms / direct_ms, 3),
            "",  # reported only: a repeat against a 2 ms upstream (serve_new_turn_vs_repeat)
            f"time to first byte through recap serve ({serve_ms:.1f} ms, direct client path) "
            f"over calling the model server directly ({direct_ms:.1f} ms), {CONVERSATION}-message "
            "conversation resent whole, upstream answering at once; medians",
        ),
        Figure("serve_ttfb_ms", round(serve_ms, 2), "", "median time to first byte via serve"),
        Figure("direct_ttfb_ms", round(direct_ms, 2), "", "median time to first byte, direct"),
        Figure(
            "litellm_overhead_vs_direct",
            round(litellm_ms / direct_ms, 3),
            "",
            f"the same request through litellm alone (serve's other client path), nothing "
            f"stored or assembled, to its first chunk ({litellm_ms:.1f} ms) over calling the "
            "model server directly; medians",
        ),
        Figure("litellm_ttfb_ms", round(litellm_ms, 2), "", "median first chunk, litellm alone"),
        Figure(
            "passthrough_overhead_vs_direct",
            round(floor_ms / direct_ms, 3),
            "",
            f"the floor: a bare proxy on serve's stack (Starlette, uvicorn, a pooled httpx "
            f"client; it parses and re-serializes the body and streams the reply, nothing else) "
            f"to the first byte ({floor_ms:.1f} ms) over calling the model server directly; "
            "medians of the same rounds",
        ),
        Figure(
            "lean_passthrough_overhead_vs_direct",
            round(lean_ms / direct_ms, 3),
            "",
            f"the least any Python proxy costs here: the bare proxy with orjson and one pooled "
            f"aiohttp session on the same uvicorn (httptools, uvloop) ({lean_ms:.1f} ms) over "
            "calling the model server directly; serve_overhead_vs_direct cannot fall below it",
        ),
        Figure(
            "serve_overhead_vs_passthrough",
            round(serve_ms / floor_ms, 3),
            "",
            "recap serve's time to first byte over the bare proxy's: what storing, mapping and "
            "assembling the conversation add on top of the second HTTP hop",
        ),
    ]


def throughput(base: str, records: list[dict[str, Any]], suffix: str) -> Figure:
    """Stored turns per second with ``CLIENTS`` clients at once."""
    auth = {"Authorization": f"Bearer {KEY}"}
    per_second = _turns_per_second(
        base, records, lambda: {**auth, "X-Recap-Conversation": str(uuid.uuid4())}
    )
    database = "PostgreSQL" if suffix else "SQLite"
    return Figure(
        f"serve_requests_per_second{suffix}",
        per_second,
        "",
        f"stored non-streaming turns per second, {CLIENTS} concurrent clients, {database}, "
        "upstream answering at once",
    )


def proxy_throughput(proxy: str, records: list[dict[str, Any]]) -> Figure:
    """The same clients' turns per second through the LiteLLM proxy (nothing stored)."""
    from bench.litellm_proxy import PROXY_KEY, PROXY_VERSION

    per_second = _turns_per_second(proxy, records, lambda: {"Authorization": f"Bearer {PROXY_KEY}"})
    return Figure(
        "litellm_proxy_requests_per_second",
        per_second,
        "",
        f"the same {CLIENTS} clients' non-streaming turns per second through the LiteLLM proxy "
        f"({PROXY_VERSION}, one worker, nothing stored) to the same model server, same run",
    )


def _turns_per_second(
    base: str, records: list[dict[str, Any]], headers_for: Callable[[], dict[str, str]]
) -> float:
    """Turns completed per second by ``CLIENTS`` clients at once, each resending its own
    growing conversation with the headers ``headers_for`` gives it."""
    start = long_conversation(records, START_HISTORY)
    errors: list[str] = []
    barrier = threading.Barrier(CLIENTS + 1)

    def client_loop() -> None:
        headers = headers_for()
        messages = [*start, {"role": "user", "content": "begin"}]
        with httpx.Client(timeout=REQUEST_TIMEOUT) as client:
            barrier.wait()
            for n in range(TURNS_PER_CLIENT):
                body = {"model": MODEL, "messages": messages}
                response = client.post(f"{base}/chat/completions", json=body, headers=headers)
                if response.status_code != 200:
                    errors.append(response.text[:200])
                    return
                reply = response.json()["choices"][0]["message"]
                messages = [*messages, reply, {"role": "user", "content": f"next {n}"}]

    threads = [threading.Thread(target=client_loop) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"bench.serve: {len(errors)} clients failed: {errors[0]}")
    return round(CLIENTS * TURNS_PER_CLIENT / elapsed, 1)
