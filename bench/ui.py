"""The web console's pages against ``recap stats --json`` on a 10,000-conversation database.

One SQLite database holds 10,000 conversations: 9,999 short chats and one agent conversation from
the shared data (the SWE-agent run ``BabyEncryption``, an 8,000-token window, compressed once
with the offline summarizer, so its page has a summary band, cleared results and a log). A real
`recap ui` process serves the console; the bench logs in over HTTP and times, in wall time,
requests for the conversations list (the default page of 25, newest activity first, the page
sorted by stored tokens and the page sorted by pressure, which the database works out and orders
over all 10,000) and the agent conversation's page, against `recap stats --json` for the same
conversation run as a command (the tool an operator would reach for instead).

- ``ui_page_vs_stats``: the slowest of the four pages' medians over the median of the command
  (bound 5).
- ``ui_list_ms``, ``ui_list_by_tokens_ms``, ``ui_list_by_pressure_ms``, ``ui_conversation_ms``,
  ``ui_stats_command_ms``: the medians themselves (reported).
- ``ui_page_vs_stats_call``: the same slowest page over ``core.service.conversation_stats`` called
  in this process (what the command spends past starting Python), reported: a page does a list's
  or a conversation's worth of such reads, and renders them.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import Figure

CONVERSATIONS = 10_000  # the database's size
BATCH = 500  # conversations per import call
CHAT_TURNS = 3  # user and assistant turns of each short chat
WINDOW = 8_000  # the agent conversation's window: it is over its trigger
AGENT = "swe-agent:trajectories/demonstrations/ctf/crypto/BabyEncryption.traj"
PAGE_ROUNDS = 21  # timed requests per page; the median of an odd count is one of them
STATS_ROUNDS = 7  # timed `recap stats` commands (each starts Python)
CALL_ROUNDS = 41  # timed in-process stats calls
WARMUP = 2  # untimed first requests: statement caches and templates warm up
BOUND = "<= 5"
UI_KEY = "bench-console-key"
ROOT = Path(__file__).resolve().parent.parent


def _chats(start: int, count: int) -> list[dict[str, Any]]:
    records = []
    for n in range(start, start + count):
        messages = []
        for turn in range(CHAT_TURNS):
            messages.append(
                {"role": "user", "content": f"chat {n}: question {turn} about order {n * 7}"}
            )
            messages.append(
                {"role": "assistant", "content": f"chat {n}: answer {turn}, order {n * 7} ships"}
            )
        records.append({"id": f"chat-{n:05d}", "messages": messages})
    return records


def _agent_record() -> dict[str, Any]:
    source = ROOT / "tests" / "data" / "swe_agent.jsonl"
    for line in source.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record.get("id") == AGENT:
            return dict(record)
    raise ValueError(f"{AGENT} is not in {source}")


def _build(url: str, folder: Path) -> None:
    from recap.core import service
    from recap.core.settings import load_settings
    from recap.core.storage.db import make_engine
    from recap.core.storage.migrate import upgrade
    from recap.workers.compress import compress_now
    from recap.workers.logs import configure_logging

    configure_logging(json_output=False, level="WARNING", force=True)  # stdout is the JSON
    engine = make_engine(url)
    upgrade(engine)
    settings = load_settings(output_dir=folder / "outputs", summary_model=None)
    service.import_conversations(engine, [_agent_record()], settings, max_input_tokens=WINDOW)
    for start in range(0, CONVERSATIONS - 1, BATCH):
        count = min(BATCH, CONVERSATIONS - 1 - start)
        service.import_conversations(engine, _chats(start, count), settings)
    result = compress_now(engine, settings, AGENT, None, True)
    if result["action"] != "summarized":
        raise SystemExit(f"bench.ui: the agent conversation was not summarized: {result}")
    engine.dispose()


def _median_ms(func: Callable[[], Any], rounds: int, warmup: int = WARMUP) -> float:
    for _ in range(warmup):
        func()
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        func()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def _wait_for_console(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit("recap ui exited:\n" + log.read_text(errors="replace")[-2000:])
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ui/login", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("recap ui did not answer in 120 s")


def run() -> list[Figure]:
    import httpx

    from tests.support.processes import free_port, stop_group

    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        url = f"sqlite:///{folder / 'bench.db'}"
        _build(url, folder)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("RECAP_")},
            "PYTHONPATH": str(ROOT),
            "RECAP_DATABASE_URL": url,
            "RECAP_OUTPUT_DIR": str(folder / "outputs"),
            "RECAP_UI_KEYS": UI_KEY,
            "RECAP_LOG_LEVEL": "WARNING",
        }
        port = free_port()
        log = folder / "ui.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "recap.workers.cli", "ui", "--port", str(port)],
                env=env,
                cwd=folder,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            _wait_for_console(port, process, log)
            pages = _time_pages(httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60))
        finally:
            stop_group(process)
        command = [sys.executable, "-m", "recap.workers.cli", "stats", AGENT, "--json"]
        stats_ms = _median_ms(
            lambda: subprocess.run(command, env=env, capture_output=True, check=True),
            STATS_ROUNDS,
            warmup=1,
        )
        call_ms = _time_stats_call(url, folder)
    slowest = max(pages.values())
    return [
        Figure(
            "ui_page_vs_stats",
            round(slowest / stats_ms, 3),
            BOUND,
            "the slowest console page (list, list by tokens, list by pressure, conversation) over "
            "`recap stats "
            "--json` for the same conversation, medians of wall time, 10,000 conversations",
        ),
        Figure("ui_list_ms", round(pages["list"], 1), "", "the conversations list, 25 rows (ms)"),
        Figure(
            "ui_list_by_tokens_ms",
            round(pages["by_tokens"], 1),
            "",
            "the list sorted by stored tokens over all 10,000 conversations (ms)",
        ),
        Figure(
            "ui_list_by_pressure_ms",
            round(pages["by_pressure"], 1),
            "",
            "the list sorted by pressure, worked out in SQL over all 10,000 conversations (ms)",
        ),
        Figure(
            "ui_conversation_ms",
            round(pages["conversation"], 1),
            "",
            "the agent conversation's page (ms)",
        ),
        Figure("ui_stats_command_ms", round(stats_ms, 1), "", "`recap stats --json` (ms)"),
        Figure(
            "ui_page_vs_stats_call",
            round(slowest / call_ms, 2),
            "",
            "the slowest page over core.service.conversation_stats called in-process",
        ),
    ]


def _time_pages(http: Any) -> dict[str, float]:
    from urllib.parse import quote

    login = http.post("/ui/login", data={"key": UI_KEY})
    if login.status_code not in (200, 303) or "recap_console" not in http.cookies:
        raise SystemExit(f"bench.ui: could not log in ({login.status_code})")

    def get(path: str) -> Callable[[], None]:
        def fetch() -> None:
            response = http.get(path)
            if response.status_code != 200:
                raise SystemExit(f"bench.ui: {path} answered {response.status_code}")

        return fetch

    return {
        "list": _median_ms(get("/ui/"), PAGE_ROUNDS),
        "by_tokens": _median_ms(get("/ui/?sort=tokens&dir=desc"), PAGE_ROUNDS),
        "by_pressure": _median_ms(get("/ui/?sort=pressure&dir=desc"), PAGE_ROUNDS),
        "conversation": _median_ms(get(f"/ui/c/{quote(AGENT, safe='')}"), PAGE_ROUNDS),
    }


def _time_stats_call(url: str, folder: Path) -> float:
    from recap.core import service
    from recap.core.settings import load_settings
    from recap.core.storage.db import make_engine

    engine = make_engine(url, create=False)
    settings = load_settings(output_dir=folder / "outputs")
    try:
        return _median_ms(lambda: service.conversation_stats(engine, AGENT, settings), CALL_ROUNDS)
    finally:
        engine.dispose()
