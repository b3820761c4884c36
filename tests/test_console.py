"""The web console without a browser: its SQL list on both databases, the token bar against
``recap stats``, the timeline's states, and the app's keys, sessions, CSRF and ownership over
HTTP (Starlette's test client on the real app and a real database; a real `recap ui` process)."""

from __future__ import annotations

import json
import os
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, update
from starlette.testclient import TestClient

from recap.core import service
from recap.core.settings import SettingsError, get_settings, load_settings
from recap.core.storage.console import list_conversations
from recap.core.storage.db import session_scope
from recap.core.storage.models import CONVERSATIONS
from recap.core.values.records import AGED as AGED_STAGE
from recap.core.values.records import ARGUMENTS, ClearingRec, Msg
from recap.core.values.records import CLEARED as CLEARED_STAGE
from recap.workers.serve.auth import fingerprint
from recap.workers.ui.app import standalone
from recap.workers.ui.bar import apportion
from recap.workers.ui.timeline import AGED, CLEARED, FULL, OMITTED, PINNED, SUMMARIZED, states
from tests.support.cli_helpers import assert_one_line_error, recap, recap_process
from tests.support.data import DATA_DIR
from tests.support.processes import free_port, stop_group, wait_for
from tests.support.serve_stack import ROOT

UI_KEY = "console-operator-key"
KEY_A, KEY_B = "client-key-a", "client-key-b"
WINDOW = 8_000  # small: the swe-agent conversation below is over its trigger
CONV = "swe-agent:trajectories/demonstrations/ctf/crypto/BabyEncryption.traj"


# --- settings ----------------------------------------------------------------------------------


def test_ui_keys_are_split_and_masked() -> None:
    """RECAP_UI_KEYS is comma-separated, and each key is a secret every output masks."""
    from recap.core.redact import known_secrets

    settings = load_settings(ui_keys=f" {UI_KEY} , second-console-key ")
    assert [k.get_secret_value() for k in settings.ui_keys] == [UI_KEY, "second-console-key"]
    assert UI_KEY in known_secrets(settings)


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"ui_keys": "short"}, "RECAP_UI_KEYS"),
        ({"ui_keys": UI_KEY, "serve_keys": f"{KEY_A},{UI_KEY}"}, "must not repeat"),
    ],
)
def test_bad_ui_keys_are_one_clear_error(values: dict[str, str], fragment: str) -> None:
    """A guessable console key, or one that is also a client key, stops the start."""
    with pytest.raises(SettingsError, match=fragment):
        load_settings(**values)


def test_recap_ui_without_a_key_is_one_line(sqlite_engine: Engine) -> None:
    """`recap ui` with no RECAP_UI_KEYS says so in one line and exits non-zero."""
    assert_one_line_error(recap("ui", "--port", str(free_port())), "RECAP_UI_KEYS")


# --- the list in SQL ---------------------------------------------------------------------------


def _new(engine: Engine, cid: str, turns: int, owner: str | None = None) -> None:
    messages = []
    for n in range(turns):
        messages += [
            {"role": "user", "content": f"question {n} of {cid}"},
            {"role": "assistant", "content": f"answer {n} of {cid}"},
        ]
    service.import_conversations(
        engine, [{"id": cid, "messages": messages}], get_settings(), max_input_tokens=WINDOW
    )
    if owner is not None:
        with session_scope(engine) as session:
            session.connection().execute(
                update(CONVERSATIONS).where(CONVERSATIONS.c.id == cid).values(owner=owner)
            )


def test_list_pages_searches_sorts_and_scopes(engine: Engine) -> None:
    """Pages are cut by the database; search is any-case and takes % and _ literally; sorts
    order by the figure asked for; a scoped view lists its owner's conversations only."""
    for index in range(7):
        _new(engine, f"Chat-{index}", index + 1, owner=fingerprint(KEY_A) if index < 3 else None)
    _new(engine, "odd_100%", 1)
    with session_scope(engine) as session:
        connection = session.connection()
        first = list_conversations(connection, sort="messages", limit=3)
        assert first.total == 8
        assert [r.id for r in first.rows] == ["Chat-6", "Chat-5", "Chat-4"]
        assert [r.messages for r in first.rows] == [14, 12, 10]
        last = list_conversations(connection, sort="messages", limit=3, offset=6)
        assert [r.id for r in last.rows] == ["odd_100%", "Chat-0"]  # ties by id, descending
        ascending = list_conversations(connection, sort="id", descending=False, limit=2)
        assert [r.id for r in ascending.rows] == ["Chat-0", "Chat-1"]
        found = list_conversations(connection, search="chat-")
        assert found.total == 7
        assert list_conversations(connection, search="_100%").total == 1
        assert list_conversations(connection, search="%").total == 1
        mine = list_conversations(connection, owner=fingerprint(KEY_A), scoped=True)
        assert sorted(r.id for r in mine.rows) == ["Chat-0", "Chat-1", "Chat-2"]
        assert list_conversations(connection, owner=None, scoped=True).total == 0
        assert first.rows[0].stored_tokens > 0 and first.rows[0].last_action is None
        with pytest.raises(ValueError, match="sort must be one of"):
            list_conversations(connection, sort="size")
        with pytest.raises(ValueError, match="pressure sort needs"):
            list_conversations(connection, sort="pressure")


def _pressure_case(engine: Engine) -> dict[str, Any]:
    """Conversations whose pressure comes from every part the budget reads: sizes, a summary
    with a pinned message in its span, clearings, a host's fixed parts and a provider reading,
    an output reserve of its own, a window from the model map, and a model of no known window."""
    from recap.core.client import Recap
    from recap.core.storage.sweep import apply_clearings
    from recap.core.values.clearing import ClearingPlan, PlannedClearing

    client = Recap(get_settings(), engine)
    for index, turns in enumerate((2, 5, 9, 14, 20)):
        _new(engine, f"size-{index}", turns)
    from tests.test_compress_worker import chat

    service.import_conversations(
        engine,
        [{"id": "summarized", "messages": chat(20)}],
        get_settings(),
        max_input_tokens=WINDOW,
    )
    stored = service.export_conversation(engine, "summarized")["messages"]
    client.pin("summarized", stored[2]["id"])
    assert client.compress("summarized", force=True).action == "summarized"
    _new(engine, "cleared", 12)
    ids = [m["id"] for m in service.export_conversation(engine, "cleared")["messages"]]
    with session_scope(engine) as session:
        plan = ClearingPlan(
            "idle", tuple(PlannedClearing(message_id=mid, tokens_reclaimed=30) for mid in ids[2:8])
        )
        apply_clearings(session, "cleared", plan)
    _new(engine, "measured", 11)
    client.assemble("measured", system="a host prompt " * 40, tools=[{"type": "function",
                    "function": {"name": "ls", "parameters": {"type": "object"}}}])  # fmt: skip
    client.record_usage("measured", prompt_tokens=2_400)
    _new(engine, "reserved", 8)
    client.set_output_reserve("reserved", 1_500)
    service.import_conversations(
        engine,
        [{"id": "mapped", "messages": [{"role": "user", "content": "hi " * 3_000}]}],
        get_settings(),
    )
    _new(engine, "unknown-model", 1)  # a model the map no longer knows, no window of its own
    with session_scope(engine) as session:
        session.connection().execute(
            update(CONVERSATIONS)
            .where(CONVERSATIONS.c.id == "unknown-model")
            .values(model="no-such-provider/no-such-model", max_input_tokens=None)
        )
    return {"client": client}


def test_the_pressure_sort_is_recap_stats_pressure_worked_out_in_sql(engine: Engine) -> None:
    """Sorting by pressure orders the conversations in the database as `recap stats` ranks
    them (each row's figure equal to its stats pressure, to rounding), pages cut by the
    database, a conversation of unknown window last either way."""
    from recap.workers.ui.views import pressure_inputs

    _pressure_case(engine)
    settings = get_settings()
    inputs = pressure_inputs(settings)
    with session_scope(engine) as session:
        connection = session.connection()
        page = list_conversations(connection, sort="pressure", pressure=inputs, limit=50)
        rising = list_conversations(
            connection, sort="pressure", descending=False, pressure=inputs, limit=50
        )
        second = list_conversations(connection, sort="pressure", pressure=inputs, limit=3, offset=3)
    order = [row.id for row in page.rows]
    assert order[-1] == "unknown-model" and page.pressures["unknown-model"] is None
    stats = {cid: service.conversation_stats(engine, cid, settings).pressure for cid in order[:-1]}
    for cid, expected in stats.items():
        assert page.pressures[cid] == pytest.approx(expected, abs=2e-3), cid
    assert order[:-1] == sorted(stats, key=lambda cid: (-stats[cid], cid))
    assert [row.id for row in rising.rows] == [*reversed(order[:-1]), "unknown-model"]
    assert [row.id for row in second.rows] == order[3:6] and second.total == page.total


# --- the bar and the timeline (pure) -----------------------------------------------------------


@pytest.mark.parametrize(
    ("parts", "total", "expected"),
    [
        ([1, 1, 1], 10, [4, 3, 3]),
        ([100, 0, 50], 150, [100, 0, 50]),
        ([3, 3], 7, [4, 3]),
        ([0, 0], 5, [5, 0]),
        ([2, 5, 1], 9, [2, 6, 1]),
    ],
)
def test_apportion_adds_up_exactly(parts: list[int], total: int, expected: list[int]) -> None:
    """Scaled parts add up to the total, by largest remainders."""
    assert apportion(parts, total) == expected
    assert sum(apportion(parts, total)) == total


def _msg(mid: int, role: str, parent: int | None) -> Msg:
    return Msg(id=mid, parent_id=parent, role=role, content=f"m{mid}", tokens=10)


@pytest.mark.parametrize(
    ("cutoff", "cleared", "dropped", "expected"),
    [
        (None, {}, [], [FULL, FULL, FULL, FULL, FULL]),
        (3, {}, [], [FULL, SUMMARIZED, SUMMARIZED, FULL, FULL]),
        (None, {4: "idle"}, [2], [FULL, OMITTED, FULL, CLEARED, FULL]),
        (2, {2: "idle", 4: "post_summary"}, [], [FULL, SUMMARIZED, FULL, CLEARED, FULL]),
        (None, {3: "arguments", 4: "aged"}, [], [FULL, FULL, AGED, AGED, FULL]),
        (None, {4: "aged+cleared"}, [], [FULL, FULL, FULL, CLEARED, FULL]),
    ],
)
def test_timeline_states(
    cutoff: int | None, cleared: dict[int, str], dropped: list[int], expected: list[str]
) -> None:
    """The root prompt is sent in full; a summary's span is summarized; then what the request
    left out is omitted and what a clearing covers is cleared."""
    branch = [
        _msg(1, "system", None),
        _msg(2, "user", 1),
        _msg(3, "assistant", 2),
        _msg(4, "tool", 3),
        _msg(5, "user", 4),
    ]
    stages = {"aged": AGED_STAGE, "arguments": ARGUMENTS, "aged+cleared": CLEARED_STAGE}
    clearings = {
        mid: ClearingRec(
            message_id=mid,
            reason="pressure",
            tokens_reclaimed=5,
            stage=stages[reason],
            arguments_tokens=5 if reason == "arguments" else 0,
        )
        if reason in stages
        else ClearingRec(message_id=mid, reason=reason, tokens_reclaimed=5)
        for mid, reason in cleared.items()
    }
    found = states(branch, summary_cutoff=cutoff, clearings=clearings, dropped=dropped)
    assert [found[m.id][0] for m in branch] == expected


@pytest.mark.parametrize(
    ("cutoff", "pinned", "dropped", "expected"),
    [
        (None, {2}, [], [FULL, PINNED, FULL, CLEARED, FULL]),
        (3, {2}, [], [FULL, PINNED, SUMMARIZED, CLEARED, FULL]),
        (None, {4}, [2], [FULL, OMITTED, FULL, PINNED, FULL]),
        (None, {1}, [], [FULL, FULL, FULL, CLEARED, FULL]),
    ],
    ids=["in-place", "in-a-summary", "over-a-clearing", "the-stored-prompt"],
)
def test_timeline_states_with_pins(
    cutoff: int | None, pinned: set[int], dropped: list[int], expected: list[str]
) -> None:
    """A pinned message is pinned wherever it is, whatever covers it; the root prompt stays
    full (it is always sent)."""
    branch = [
        _msg(1, "system", None),
        _msg(2, "user", 1),
        _msg(3, "assistant", 2),
        _msg(4, "tool", 3),
        _msg(5, "user", 4),
    ]
    clearings = {4: ClearingRec(message_id=4, reason="idle", tokens_reclaimed=5)}
    found = states(
        branch, summary_cutoff=cutoff, clearings=clearings, dropped=dropped, pinned=pinned
    )
    assert [found[m.id][0] for m in branch] == expected


# --- the app over HTTP -------------------------------------------------------------------------


@pytest.fixture
def console(sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Engine:
    """A database with the agent conversation (compressed once) and one conversation of each
    client key, and the console's keys set."""
    monkeypatch.setenv("RECAP_UI_KEYS", UI_KEY)
    monkeypatch.setenv("RECAP_SERVE_KEYS", f"{KEY_A},{KEY_B}")
    monkeypatch.setenv("RECAP_BROKER_URL", "filesystem://")
    # without the aged stage the results after the summary are cleared (its own state is shown
    # by test_timeline_states): the page shows a cleared one
    monkeypatch.setenv("RECAP_AGED_RESULT_CHARS", "0")
    get_settings.cache_clear()
    line = (DATA_DIR / "swe_agent.jsonl").read_text(encoding="utf-8").splitlines()[0]
    (tmp_path / "agent.jsonl").write_text(line + "\n", encoding="utf-8")
    assert (
        recap("import", str(tmp_path / "agent.jsonl"), "--max-input-tokens", str(WINDOW)).code == 0
    )
    assert recap("compress", CONV, "--force", "--json").json()["action"] == "summarized"
    _new(sqlite_engine, "chat-of-a", 2, owner=fingerprint(KEY_A))
    _new(sqlite_engine, "chat-of-b", 2, owner=fingerprint(KEY_B))
    return sqlite_engine


def client() -> TestClient:
    return TestClient(standalone(), base_url="http://127.0.0.1")


def log_in(http: TestClient, key: str) -> httpx.Response:
    return http.post("/ui/login", data={"key": key}, follow_redirects=False)


def csrf_of(page: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match, "no CSRF field on the page"
    return match[1]


def conversation_path(cid: str) -> str:
    from urllib.parse import quote

    return f"/ui/c/{quote(cid, safe='')}"


def test_pages_need_a_session_and_a_right_key(console: Engine) -> None:
    """Without a session every page leads to the login; a wrong key is refused; a console key
    opens an HttpOnly, SameSite=Strict session cookie scoped to /ui/."""
    http = client()
    for path in ("/ui/", conversation_path(CONV)):
        response = http.get(path, follow_redirects=False)
        assert response.status_code == 303 and response.headers["location"] == "/ui/login"
    refused = log_in(http, "not-a-key")
    assert refused.status_code == 401 and "wrong key" in refused.text
    assert "set-cookie" not in refused.headers
    accepted = log_in(http, UI_KEY)
    assert accepted.status_code == 303
    cookie = accepted.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui/" in cookie
    assert UI_KEY not in cookie
    listing = http.get("/ui/")
    assert listing.status_code == 200
    for cid in (CONV, "chat-of-a", "chat-of-b"):
        assert f'data-conversation="{cid}"' in listing.text
    assert "default-src 'self'" in listing.headers["content-security-policy"]


def test_a_client_key_sees_its_own_conversations_only(console: Engine) -> None:
    """A serve client key lists and opens its own conversations; another key's and the
    library's are not found; it takes no action."""
    http = client()
    assert log_in(http, KEY_A).status_code == 303
    listing = http.get("/ui/")
    assert 'data-conversation="chat-of-a"' in listing.text
    assert "chat-of-b" not in listing.text and CONV not in listing.text
    assert http.get(conversation_path("chat-of-a")).status_code == 200
    for cid in ("chat-of-b", CONV, "no-such-conversation"):
        refused = http.get(conversation_path(cid))
        assert refused.status_code == 404 and "unknown conversation" in refused.text
    page = http.get(conversation_path("chat-of-a")).text
    assert "Compress now" not in page
    action = http.post(
        "/ui/actions/compress", data={"csrf": csrf_of(page), "conversation": "chat-of-a"}
    )
    assert action.status_code == 403


def test_actions_need_the_csrf_token_and_this_origin(console: Engine, tmp_path: Path) -> None:
    """A POST without the session's CSRF token, or from another origin, is refused and sends
    nothing; with both, compress now goes to the broker through compress_later."""
    http = client()
    log_in(http, UI_KEY)
    page = http.get(conversation_path(CONV)).text
    form = {"conversation": CONV, "csrf": "forged"}
    assert http.post("/ui/actions/compress", data=form).status_code == 403
    form["csrf"] = csrf_of(page)
    elsewhere = {"origin": "http://attacker.example"}
    assert http.post("/ui/actions/compress", data=form, headers=elsewhere).status_code == 403
    broker = tmp_path / "broker"
    assert not broker.exists() or not any(broker.rglob("*.msg"))
    sent = http.post("/ui/actions/compress", data=form, follow_redirects=False)
    assert sent.status_code == 303 and "enqueued=" in sent.headers["location"]
    assert any(broker.rglob("*.msg")), "no message reached the broker folder"
    notice = http.get(sent.headers["location"])
    assert 'data-testid="enqueued"' in notice.text


def test_the_bar_matches_recap_stats_to_the_token(console: Engine) -> None:
    """The conversation page's bar adds up to `recap stats --json`'s used tokens, with its
    window, reserve and trigger; the timeline shows the summary band and cleared results."""
    stats = recap("stats", CONV, "--json").json()
    http = client()
    log_in(http, UI_KEY)
    page = http.get(conversation_path(CONV)).text
    segments = {
        name: int(value.replace(",", ""))
        for name, value in re.findall(r'data-segment="(\w+)">([\d,]+)<', page)
    }
    parts = ("system", "tools", "summary", "history", "media", "reasoning")
    assert sum(segments[name] for name in parts) == stats["used"]
    assert segments["reserve"] == stats["output_reserve"]
    assert sum(segments.values()) >= stats["window"]
    table = re.search(r'data-testid="bar-table"([^>]*)>', page)
    assert table is not None
    assert f'data-window="{stats["window"]}"' in table[1]
    assert f'data-trigger="{stats["trigger"]}"' in table[1]
    assert f'data-used="{stats["used"]}"' in table[1]
    assert 'class="band in-effect"' in page
    assert 'data-state="cleared"' in page and 'data-state="summarized"' in page
    chart = re.search(r'<script type="application/json" id="turns-data">(.*?)</script>', page)
    assert chart is not None and json.loads(chart[1])["now"]["y"] == stats["used"]


def test_recap_serve_mounts_the_console(console: Engine) -> None:
    """`recap serve`'s app serves the console at /ui when UI keys are set (and not without)."""
    from recap.workers.serve.app import create_app

    served = TestClient(create_app(get_settings()), base_url="http://127.0.0.1")
    assert served.get("/ui/login").status_code == 200
    log_in(served, UI_KEY)
    assert 'data-conversation="chat-of-a"' in served.get("/ui/").text
    without = create_app(load_settings(ui_keys=()))
    assert TestClient(without).get("/ui/login").status_code == 404


def test_recap_ui_runs_on_its_own(console: Engine, tmp_path: Path) -> None:
    """`recap ui --port N` serves the console at /ui on 127.0.0.1, / leading there."""
    import subprocess
    import sys

    port = free_port()
    log = tmp_path / "ui.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "recap.workers.cli", "ui", "--port", str(port)],
            env=env,
            cwd=tmp_path,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def answers() -> Any:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/", timeout=2, follow_redirects=True)
            except httpx.HTTPError:
                return None

        first = wait_for(answers, 60, "recap ui", log)
        assert first.status_code == 200 and "Log in" in first.text  # / -> /ui/ -> /ui/login
        assert str(first.url).endswith("/ui/login")
    finally:
        stop_group(process)
    assert recap_process("ui", "--port", "0", env=env).code != 0  # port 0 is out of range


def test_the_page_shows_pins_and_the_request_as_of_a_time(console: Engine) -> None:
    """A pinned message is `pinned` in the timeline (inside the summary's band) and sent right
    after the summary; the request as of a time before the summary has none, one as of now
    the summary; a time that is not one is a 400 with one clear line, one before the first
    message says so; neither is an error page."""
    from datetime import timedelta

    exported = service.export_conversation(console, CONV)["messages"]
    first_user = next(m for m in exported if m["role"] == "user")
    assert recap("pin", CONV, str(first_user["id"])).code == 0
    http = client()
    log_in(http, UI_KEY)
    page = http.get(conversation_path(CONV)).text
    assert f'data-message="{first_user["id"]}" data-state="pinned"' in page
    assert 'data-testid="pinned-count">1<' in page
    summary = service.list_summaries(console, CONV)[-1]
    before = datetime.fromisoformat(summary.created_at) - timedelta(microseconds=1)
    past = http.get(conversation_path(CONV), params={"as_of": before.isoformat()})
    assert past.status_code == 200
    assert 'data-testid="as-of-summary" data-summary=""' in past.text
    now = http.get(conversation_path(CONV), params={"as_of": "2999-01-01T00:00:00Z"})
    assert f'data-testid="as-of-summary" data-summary="{summary.id}"' in now.text
    bad = http.get(conversation_path(CONV), params={"as_of": "last tuesday"})
    assert bad.status_code == 400
    problem = re.search(r'data-testid="as-of-problem">([^<]*)<', bad.text)
    assert problem is not None and "is not a time" in problem[1]
    assert 'data-testid="bar-table"' in bad.text  # the rest of the page is there
    early = http.get(conversation_path(CONV), params={"as_of": "2000-01-01"})
    assert early.status_code == 200
    assert "no message at or before" in early.text
    listing = http.get("/ui/", params={"sort": "pressure"})
    assert listing.status_code == 200 and 'class="active">pressure' in listing.text


def test_an_empty_conversation_has_a_page(console: Engine) -> None:
    """A conversation with no message yet lists and opens: the request says there is nothing to
    send, the bar is the fixed parts alone."""
    assert recap("new", "--id", "empty-one", "--max-input-tokens", str(WINDOW)).code == 0
    http = client()
    log_in(http, UI_KEY)
    assert 'data-conversation="empty-one"' in http.get("/ui/?q=EMPTY").text
    page = http.get(conversation_path("empty-one"))
    assert page.status_code == 200
    assert 'data-testid="request-problem"' in page.text


def _sent_reference(history: Any, index: int) -> int:
    """What Recap sent before position ``index``, summed the slow way."""
    branch = history.branch
    at = history.created[branch[index].id]
    cuts = [
        (branch.index(next(m for m in branch if m.id == s.cutoff_message_id)), s.tokens)
        for s in history.summaries
        if s.created_at <= at
    ]
    cuts = [(cut, tokens) for cut, tokens in cuts if cut < index]
    start, head = 0, 0
    if cuts:
        cut, tokens = max(cuts)
        start, head = cut + 1, tokens + branch[0].tokens
    total = head + sum(m.tokens for m in branch[start:index])
    for position in range(start, index):
        mid = branch[position].id
        if mid in history.clearings and history.cleared_at[mid] <= at:
            total -= history.clearings[mid].tokens_reclaimed
    return max(total, 0)


@pytest.mark.parametrize("seed", range(20))
def test_the_chart_sums_what_was_sent_as_a_reference_does(seed: int) -> None:
    """On seeded random branches with summaries and clearings written over time, the chart's
    'with Recap' series equals a plain sum of what was sent before each call."""
    import random
    from datetime import UTC, datetime, timedelta

    from recap.core.values.records import SummaryRec
    from recap.workers.ui.chart import History, sent_then

    rng = random.Random(seed)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    size = rng.randint(5, 80)
    roles = ["system"] + [rng.choice(["user", "assistant", "tool"]) for _ in range(size - 1)]
    branch = [
        Msg(
            id=10 + i,
            parent_id=(9 + i) if i else None,
            role=role,
            content="x",
            tokens=rng.randint(1, 90),
        )
        for i, role in enumerate(roles)
    ]
    created = {m.id: start + timedelta(minutes=i) for i, m in enumerate(branch)}
    summaries = [
        SummaryRec(
            id=n,
            cutoff_message_id=branch[cut].id,
            previous_summary_id=None,
            text="s",
            tokens=rng.randint(5, 40),
            created_at=start + timedelta(minutes=rng.randint(cut, size + 5)),
        )
        for n, cut in enumerate(sorted(rng.sample(range(1, size), min(3, size - 1))))
    ]
    cleared = rng.sample([m.id for m in branch[1:]], rng.randint(0, size // 2))
    clearings = {
        mid: ClearingRec(message_id=mid, reason="idle", tokens_reclaimed=rng.randint(0, 10))
        for mid in cleared
    }
    cleared_at = {mid: created[mid] + timedelta(minutes=rng.randint(0, 30)) for mid in cleared}
    history = History(
        branch=branch,
        created=created,
        summaries=summaries,
        clearings=clearings,
        cleared_at=cleared_at,
        has_root_prompt=True,
    )
    calls = [i for i, m in enumerate(branch) if m.role == "assistant"]
    found = sent_then(history, calls)
    assert found == {i: _sent_reference(history, i) for i in calls}


def test_a_failed_run_shows_masked_and_can_be_retried(
    console: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run the summarizer failed (a 401 that quotes the key) is in the page's log with the
    key masked, never in full; the retry button sends it again through compress_later."""
    from tests.support.llm_server import LLMServer, Reply

    secret = "sk-console-test-abcdefghijklmnop-wxyz"
    server = LLMServer().start()
    try:
        monkeypatch.setenv("RECAP_SUMMARY_MODEL", "openai/stand-in")
        monkeypatch.setenv("RECAP_SUMMARY_API_BASE", server.url)
        monkeypatch.setenv("RECAP_SUMMARY_API_KEY", secret)
        monkeypatch.setenv("RECAP_MAX_ATTEMPTS", "1")
        get_settings.cache_clear()
        lines = (DATA_DIR / "swe_agent.jsonl").read_text(encoding="utf-8").splitlines()
        record = json.loads(lines[3])
        service.import_conversations(console, [record], get_settings(), max_input_tokens=WINDOW)
        server.script(Reply(status=401, error=f"Incorrect API key provided: {secret}."))
        failed = recap("compress", record["id"], "--force", "--json")
        assert failed.code == 1 and json.loads(failed.stdout)["action"] == "failed"
    finally:
        server.stop()
    http = client()
    log_in(http, UI_KEY)
    page = http.get(conversation_path(record["id"])).text
    assert 'data-action="failed"' in page and 'data-testid="retry"' in page
    assert secret not in page and "sk-...wxyz" in page
    form = {"conversation": record["id"], "csrf": csrf_of(page)}
    sent = http.post("/ui/actions/retry", data=form, follow_redirects=False)
    assert sent.status_code == 303 and "enqueued=" in sent.headers["location"]
    listing = http.get("/ui/?sort=failures").text
    assert listing.index(record["id"]) < listing.index(CONV)  # the failed one first
