"""The web console in a real browser: Playwright driving Debian's Chromium headless against a
real `recap serve` (the console at /ui), a real `recap worker` on the file broker, the stand-in
model server, and an SQLite database the test fills through the CLI and through serve.

Skipped with a reason where Playwright or Chromium is missing (a failure under CI=true). Each
page is saved at 1280 and 390 pixels wide under ``test-artifacts/``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import openai
import pytest
from sqlalchemy import Engine, func, select

from recap.core import service
from recap.core.storage.db import make_engine
from recap.core.storage.migrate import upgrade
from recap.core.storage.models import CompactionLog, table_of
from tests.support.browser import WIDTHS, chromium, missing_browser, screenshot, watch
from tests.support.cli_helpers import recap_process
from tests.support.data import DATA_DIR
from tests.support.llm_server import LLMServer
from tests.support.processes import wait_for
from tests.support.serve_stack import serve_process
from tests.support.services import need_service
from tests.support.worker_stack import WorkerProcess, worker_env

UI_KEY = "console-operator-key"
KEY_A, KEY_B = "client-key-a", "client-key-b"
WINDOW = 8_000  # small: both agent conversations are over their trigger
WORKER_TIMEOUT = 120.0  # a worker imports litellm before its first run
AGENT = "swe-agent:trajectories/demonstrations/ctf/crypto/BabyEncryption.traj"  # the worker's
BUTTON = "swe-agent:trajectories/demonstrations/ctf/crypto/katy.traj"  # compressed from the page
AGENT_LINES = (0, 3)  # their lines in tests/data/swe_agent.jsonl
PARTS = ("system", "tools", "summary", "history", "media", "reasoning")
LONG_CHAT = "long-chat-of-a"  # made turn by turn through serve, compressed by the worker as it grew
README_HEIGHT = 1_250  # pixels of the docs' picture: the head, the bar and the chart
LONG_TURNS = 24  # ~600 tokens a turn (the stand-in model reports half): over the trigger mid-way


@dataclass
class Stack:
    base: str  # the console's URL, http://127.0.0.1:PORT/ui
    env: dict[str, str]  # the environment of serve, the worker and the CLI
    engine: Engine
    worker: WorkerProcess
    browser: Any
    owned: dict[str, str]  # client key -> the short conversation it made through serve


def _reply(body: dict[str, Any]) -> str:
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    return f"reply to: {str(users[-1].get('content'))[:60]}" if users else "hello"


def _runs(engine: Engine, cid: str) -> int:
    """compress_session runs the worker logged for the conversation (a skip streak is one row
    counting its ``repeats``)."""
    log = table_of(CompactionLog)
    with engine.connect() as connection:
        total = func.coalesce(func.sum(log.c.repeats), 0)
        statement = select(total).where(log.c.conversation_id == cid)
        return int(connection.execute(statement).scalar_one())


def _long_chat(client: openai.OpenAI, engine: Engine, worker: WorkerProcess) -> None:
    """A chat through serve, each turn waiting for the worker's run after it, so that the
    summary and clearings land mid-way, as they would live."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful agent."}]
    for n in range(LONG_TURNS):
        words = " ".join(f"t{n}w{i}" for i in range(150))
        messages.append({"role": "user", "content": f"turn {n} about src/module_{n}.py: {words}"})
        reply = client.chat.completions.create(
            model="openai/gpt-4o-mini",
            messages=messages,  # type: ignore[arg-type]
            extra_headers={"X-Recap-Conversation": LONG_CHAT},
        )
        messages.append(reply.choices[0].message.model_dump(exclude_none=True))
        wait_for(lambda n=n: _runs(engine, LONG_CHAT) > n, WORKER_TIMEOUT, "a run", worker.log)


def _import_agents(folder: Path, env: dict[str, str]) -> None:
    lines = (DATA_DIR / "swe_agent.jsonl").read_text(encoding="utf-8").splitlines()
    source = folder / "agents.jsonl"
    source.write_text("".join(lines[i] + "\n" for i in AGENT_LINES), encoding="utf-8")
    done = recap_process("import", str(source), "--max-input-tokens", str(WINDOW), env=env)
    assert done.code == 0, done.stderr


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    problem = missing_browser()
    if problem is not None:
        need_service("a headless browser", problem)
    folder = tmp_path_factory.mktemp("console")
    url = f"sqlite:///{folder / 'recap.db'}"
    values = {
        "RECAP_DATABASE_URL": url,
        "RECAP_BROKER_URL": "filesystem://",
        "RECAP_BROKER_FOLDER": str(folder / "broker"),
        "RECAP_OUTPUT_DIR": str(folder / "outputs"),
        "RECAP_UI_KEYS": UI_KEY,
        "RECAP_SERVE_KEYS": f"{KEY_A},{KEY_B}",
        "RECAP_SERVE_MAX_INPUT_TOKENS": str(WINDOW),
        "RECAP_UPSTREAM_API_KEY": "sk-upstream-secret-for-tests",
        # no aged stage here: the worker's post-summary step clears (the aged state has its own
        # tests in tests/test_console.py); with it on, this trajectory's short results stay full
        "RECAP_AGED_RESULT_CHARS": "0",
    }
    engine = make_engine(url)
    upgrade(engine)
    with ExitStack() as stop:
        stop.callback(engine.dispose)
        llm = LLMServer(default=_reply).start()
        stop.callback(llm.stop)
        values["RECAP_UPSTREAM_API_BASE"] = llm.url
        env = worker_env(**values)
        worker = WorkerProcess(env, folder / "worker.log").launch()  # boots while we set up
        stop.callback(worker.stop)
        _import_agents(folder, env)
        served = stop.enter_context(serve_process(values, folder / "serve"))
        owned = {}
        for key in (KEY_A, KEY_B):
            cid = f"chat-of-{key}"
            client = openai.OpenAI(base_url=served.base_url, api_key=key, max_retries=0)
            client.chat.completions.create(
                model="openai/gpt-4o-mini",
                messages=[{"role": "user", "content": f"hello from {key}"}],
                extra_headers={"X-Recap-Conversation": cid},
            )
            owned[key] = cid
        worker.wait_ready(1, WORKER_TIMEOUT)
        _long_chat(
            openai.OpenAI(base_url=served.base_url, api_key=KEY_A, max_retries=0), engine, worker
        )
        sent = recap_process("compress", AGENT, "--force", "--enqueue", "--json", env=env)
        assert sent.code == 0, sent.stderr
        wait_for(
            lambda: service.list_summaries(engine, AGENT),
            WORKER_TIMEOUT,
            "the worker's summary",
            worker.log,
        )
        browser = stop.enter_context(chromium())
        base = f"http://127.0.0.1:{served.port}/ui"
        yield Stack(base, env, engine, worker, browser, owned)


def page_of(stack: Stack, width: int = WIDTHS[0]) -> Any:
    context = stack.browser.new_context(viewport={"width": width, "height": 900})
    return context.new_page()


def log_in(stack: Stack, key: str, width: int = WIDTHS[0]) -> Any:
    page = page_of(stack, width)
    page.goto(f"{stack.base}/")
    assert page.url.endswith("/ui/login")
    page.fill("#key", key)
    page.click("form[action$='/login'] button")
    page.wait_for_load_state()
    return page


def conversation_url(stack: Stack, cid: str) -> str:
    return f"{stack.base}/c/{quote(cid, safe='')}"


def test_log_in_and_list_the_conversations(stack: Stack) -> None:
    """The console key logs in; the list shows the conversations this test made (imported ones
    and those each client key made through serve), with their owners."""
    for width in WIDTHS:
        page = log_in(stack, UI_KEY, width)
        assert page.url.rstrip("/").endswith("/ui")
        listed = page.locator("tr[data-conversation]").evaluate_all(
            "rows => rows.map(r => r.dataset.conversation)"
        )
        assert {AGENT, BUTTON, LONG_CHAT, *stack.owned.values()} <= set(listed)
        row = page.locator(f"tr[data-conversation='{stack.owned[KEY_A]}']")
        assert "key 1" in row.inner_text()
        assert page.get_by_test_id("total").inner_text() == str(len(listed))
        page.context.close()


def test_the_bar_matches_recap_stats(stack: Stack) -> None:
    """The worker-compressed conversation's bar adds up to `recap stats --json` to the token,
    in the table and in the chart the browser drew (from the console's own copy of Chart.js:
    no request leaves the host, and the page logs no error, a refused script or style
    included)."""
    done = recap_process("stats", AGENT, "--json", env=stack.env)
    stats = json.loads(done.stdout)
    for width in WIDTHS:
        page = log_in(stack, UI_KEY, width)
        errors, elsewhere = watch(page, stack.base.rsplit("/ui", 1)[0])
        page.goto(conversation_url(stack, AGENT))
        table = page.get_by_test_id("bar-table")
        cells = page.locator("[data-segment]").evaluate_all(
            "cells => cells.map(c => [c.dataset.segment, c.textContent.replaceAll(',', '')])"
        )
        segments = {name: int(value) for name, value in cells}
        assert sum(segments[name] for name in PARTS) == stats["used"]
        assert segments["reserve"] == stats["output_reserve"]
        assert int(table.get_attribute("data-window") or 0) == stats["window"]
        assert int(table.get_attribute("data-trigger") or 0) == stats["trigger"]
        drawn = page.evaluate(
            "() => Chart.getChart(document.getElementById('bar'))"
            ".data.datasets.map(d => [d.label, d.data[0]])"
        )
        assert dict(drawn) == segments
        assert errors == [] and elsewhere == []
        page.context.close()


def test_the_timeline_shows_the_workers_summary_and_clearings(stack: Stack) -> None:
    """The summary the real worker wrote is a band over its span, with its text, identifier
    retention and model; the results it cleared after the summary are marked cleared."""
    summary = service.list_summaries(stack.engine, AGENT)[-1]
    page = log_in(stack, UI_KEY)
    page.goto(conversation_url(stack, AGENT))
    band = page.locator(f"li.band[data-summary='{summary.id}']")
    assert band.count() == 1
    assert band.get_attribute("data-cutoff") == str(summary.cutoff_message_id)
    assert "in-effect" in (band.get_attribute("class") or "")
    assert summary.model in band.inner_text()
    assert "identifier retention" in band.get_by_test_id("retention").inner_text()
    band.locator("details.summary-text > summary").click()
    assert band.get_by_test_id("summary-text").inner_text().strip()
    assert page.locator("li.entry[data-state='cleared']").count() >= 1
    assert band.locator("li.entry[data-state='summarized']").count() >= 1
    log_actions = page.locator("table.log tr[data-action]").evaluate_all(
        "rows => rows.map(r => r.dataset.action)"
    )
    assert "summarized" in log_actions
    page.context.close()


def test_the_chart_shows_what_recap_sent_against_the_whole_history(stack: Stack) -> None:
    """The serve-made chat was summarized as it grew: after the summary, the requests Recap
    sent are smaller than the whole history, and the provider's readings are plotted."""
    assert service.list_summaries(stack.engine, LONG_CHAT), "the worker wrote no summary"
    page = log_in(stack, UI_KEY)
    page.goto(conversation_url(stack, LONG_CHAT))
    drawn = page.evaluate(
        "() => Chart.getChart(document.getElementById('turns'))"
        ".data.datasets.map(d => [d.label, d.data.map(p => p.y)])"
    )
    series = dict(drawn)
    without, sent = (
        series["without Recap (the whole history)"],
        series["with Recap (what was sent then)"],
    )
    assert len(without) == LONG_TURNS and sent[-1] < without[-1]
    assert len(series["provider reported"]) == LONG_TURNS
    assert page.locator("li.band.in-effect").count() == 1
    page.context.close()


def test_compress_now_produces_a_summary(stack: Stack) -> None:
    """The button enqueues a forced run through compress_later; the worker writes a summary,
    and the page shows its band."""
    assert not service.list_summaries(stack.engine, BUTTON)
    page = log_in(stack, UI_KEY)
    page.goto(conversation_url(stack, BUTTON))
    assert page.locator("li.band").count() == 0
    page.get_by_test_id("compress-now").click()
    page.wait_for_load_state()
    assert "enqueued" in page.get_by_test_id("enqueued").inner_text().lower()
    wait_for(
        lambda: service.list_summaries(stack.engine, BUTTON),
        WORKER_TIMEOUT,
        "the summary compress now asked for",
        stack.worker.log,
    )
    page.goto(conversation_url(stack, BUTTON))
    assert page.locator("li.band.in-effect").count() == 1
    page.context.close()


def test_a_wrong_key_and_another_keys_conversation_are_refused(stack: Stack) -> None:
    """A wrong key stays on the login page; a client key sees its own conversation only, gets
    'not found' for another key's, and has no action button."""
    page = log_in(stack, "not-the-key")
    assert page.get_by_test_id("login-problem").inner_text() == "wrong key"
    assert page.context.cookies() == []
    page.goto(conversation_url(stack, AGENT))
    assert page.url.endswith("/ui/login")
    page.context.close()
    page = log_in(stack, KEY_A)
    listed = page.locator("tr[data-conversation]").evaluate_all(
        "rows => rows.map(r => r.dataset.conversation)"
    )
    assert sorted(listed) == sorted([stack.owned[KEY_A], LONG_CHAT])
    response = page.goto(conversation_url(stack, stack.owned[KEY_B]))
    assert response is not None and response.status == 404
    assert "unknown conversation" in page.get_by_test_id("error").inner_text()
    page.goto(conversation_url(stack, stack.owned[KEY_A]))
    assert page.get_by_test_id("compress-now").count() == 0
    page.context.close()


def test_a_pinned_message_is_marked_and_sent_after_the_summary(stack: Stack) -> None:
    """`recap pin` on a message the worker's summary covers: at both widths the timeline marks
    it pinned inside the summary's band and counts it, and the request as it would be sent now
    carries it right after the summary."""
    summary = service.list_summaries(stack.engine, AGENT)[-1]
    exported = service.export_conversation(stack.engine, AGENT)["messages"]
    target = next(
        m for m in exported[1:] if m["role"] == "user" and m["id"] < summary.cutoff_message_id
    )
    done = recap_process("pin", AGENT, str(target["id"]), "--json", env=stack.env)
    assert done.code == 0 and json.loads(done.stdout)["pinned"], done.stderr
    for width in WIDTHS:
        page = log_in(stack, UI_KEY, width)
        errors, _ = watch(page, stack.base.rsplit("/ui", 1)[0])
        page.goto(conversation_url(stack, AGENT))
        entry = page.locator(f"li.entry[data-message='{target['id']}']")
        assert entry.get_attribute("data-state") == "pinned"
        band = page.locator(f"li.band[data-summary='{summary.id}']")
        assert band.locator("li.entry[data-state='pinned']").count() == 1
        assert page.get_by_test_id("pinned-count").inner_text() == "1"
        sent = json.loads(page.get_by_test_id("request").text_content() or "[]")
        assert sent[1]["content"].startswith("Summary") and sent[2] == {
            "role": "user",
            "content": target["content"],
        }
        assert errors == []
        page.context.close()


def test_the_request_as_of_a_chosen_time(stack: Stack) -> None:
    """The time field on the conversation page shows the request as `recap assemble --as-of`
    builds it: before the worker's first summary none is sent, after its last one that one
    is; a time that is not one is one clear line on the page (400), not an error page."""
    summaries = service.list_summaries(stack.engine, LONG_CHAT)
    before = datetime.fromisoformat(summaries[0].created_at) - timedelta(microseconds=1)
    page = log_in(stack, UI_KEY)
    errors, _ = watch(page, stack.base.rsplit("/ui", 1)[0])
    page.goto(conversation_url(stack, LONG_CHAT))
    for moment, summary_id in ((before, None), (datetime.now(UTC), summaries[-1].id)):
        page.get_by_test_id("as-of-input").fill(moment.isoformat())
        with page.expect_navigation() as navigation:
            page.get_by_test_id("as-of-show").click()
        assert navigation.value.status == 200
        shown = page.get_by_test_id("as-of-summary")
        expected = recap_process(
            "assemble", LONG_CHAT, "--as-of", moment.isoformat(), "--json", env=stack.env
        )
        request = json.loads(expected.stdout)
        assert request["summary_id"] == summary_id
        assert shown.get_attribute("data-summary") == (
            "" if summary_id is None else str(summary_id)
        )
        assert int(shown.get_attribute("data-messages") or 0) == len(request["messages"])
        assert page.get_by_test_id("as-of-input").input_value() == moment.isoformat()
    page.get_by_test_id("as-of-input").fill("the day before yesterday")
    with page.expect_navigation() as navigation:
        page.get_by_test_id("as-of-show").click()
    assert navigation.value.status == 400
    assert "is not a time" in page.get_by_test_id("as-of-problem").inner_text()
    assert page.get_by_test_id("bar-table").count() == 1  # the rest of the page is there
    assert [e for e in errors if "400" not in e] == []  # the browser logs the status alone
    page.context.close()


def _listed_pressures(page: Any) -> list[tuple[str, float | None]]:
    return [
        (str(cid), None if value in (None, "") else float(value))
        for cid, value in page.locator("tr[data-conversation]").evaluate_all(
            "rows => rows.map(r => [r.dataset.conversation,"
            " (r.querySelector('[data-pressure]') || {dataset: {}}).dataset.pressure])"
        )
    ]


def test_the_list_sorts_by_pressure(stack: Stack) -> None:
    """The pressure header sorts the list in the database, highest first, then lowest first on
    a second click: the order agrees with each row's `recap stats` pressure."""
    page = log_in(stack, UI_KEY)
    page.locator("table.list th a", has_text="pressure").click()
    page.wait_for_load_state()
    assert "sort=pressure" in page.url and "dir=desc" in page.url
    falling = _listed_pressures(page)
    assert len(falling) >= 5 and all(value is not None for _, value in falling)
    values = [value for _, value in falling if value is not None]
    assert all(a >= b - 1e-3 for a, b in itertools.pairwise(values)), falling
    page.locator("table.list th a", has_text="pressure").click()
    page.wait_for_load_state()
    assert "dir=asc" in page.url
    rising = [value for _, value in _listed_pressures(page) if value is not None]
    assert all(a <= b + 1e-3 for a, b in itertools.pairwise(rising)), rising
    assert sorted(cid for cid, _ in falling) == sorted(cid for cid, _ in _listed_pressures(page))
    page.context.close()


def test_screenshots_of_every_page_at_both_widths(stack: Stack) -> None:
    """The login, list and conversation pages at 1280 and 390 pixels, saved as artifacts; at
    both widths the page is no wider than the viewport (tables scroll inside their box)."""
    saved = []
    for width in WIDTHS:
        page = page_of(stack, width)
        page.goto(f"{stack.base}/login")
        saved.append(screenshot(page, f"console-login-{width}"))
        page.context.close()
        page = log_in(stack, UI_KEY, width)
        saved.append(screenshot(page, f"console-list-{width}"))
        page.goto(conversation_url(stack, LONG_CHAT))
        saved.append(screenshot(page, f"console-conversation-{width}-top", full_page=False))
        if width == WIDTHS[0]:  # the picture for the docs: the bar and the chart in one view
            page.set_viewport_size({"width": width, "height": README_HEIGHT})
            saved.append(screenshot(page, "console-readme", full_page=False))
        page.locator("li.band details.summary-text > summary").first.click()
        saved.append(screenshot(page, f"console-conversation-{width}"))
        overflow = page.evaluate("() => document.documentElement.scrollWidth")
        assert overflow <= width, f"the page is {overflow} px wide at {width}"
        page.context.close()
    assert all(path.stat().st_size > 0 for path in saved)
