"""The console under hostile input, over HTTP on the real app and a real database (SQLite and
PostgreSQL): every id and number a page or an action takes is checked by one rule per field
(a 400 or 404 with one clear line, nothing enqueued, never a 500), logins are rate-limited per
client address, logout needs the CSRF token, the Origin check compares the scheme, and every
response (static files included) carries the security headers."""

from __future__ import annotations

import html
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from recap.core import service
from recap.core.settings import get_settings
from tests.test_console import KEY_A, UI_KEY, _new, conversation_path, csrf_of, log_in
from recap.workers import enqueue
from recap.workers.serve.auth import fingerprint
from recap.workers.ui.app import standalone

INT64_MAX = 2**63 - 1


@pytest.fixture
def chats(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[int]]]:
    """Two small conversations (and one of client key A) on the file broker under this test's
    folder; each one's message ids."""
    enqueue.reset()  # a sending app cached by an earlier test writes to that test's folder
    monkeypatch.setenv("RECAP_UI_KEYS", UI_KEY)
    monkeypatch.setenv("RECAP_SERVE_KEYS", KEY_A)
    monkeypatch.setenv("RECAP_BROKER_URL", "filesystem://")
    get_settings.cache_clear()
    _new(engine, "left", 3)
    _new(engine, "right", 3)
    _new(engine, "theirs", 1, owner=fingerprint(KEY_A))
    yield {
        cid: [int(m["id"]) for m in service.export_conversation(engine, cid)["messages"]]
        for cid in ("left", "right", "theirs")
    }
    enqueue.reset()


def client() -> TestClient:
    return TestClient(standalone(), base_url="http://127.0.0.1")


def sent(tmp_path: Path) -> int:
    """Messages that reached the file broker's folder (the tests run in ``tmp_path``)."""
    broker = tmp_path / "broker"
    return len(list(broker.rglob("*.msg"))) if broker.exists() else 0


def operator() -> tuple[TestClient, str]:
    """A logged-in operator's client and its CSRF token."""
    http = client()
    assert log_in(http, UI_KEY).status_code == 303
    return http, csrf_of(http.get(conversation_path("left")).text)


def one_line(page: str) -> str:
    """The message of an error page."""
    match = re.search(r'<p class="problem"[^>]*>([^<]*)<', page)
    assert match, page[:500]
    return html.unescape(match[1])


# --- ids and numbers -------------------------------------------------------------------------


MALFORMED_LEAVES = ["²", "٣", "0", "-1", "+3", " 3", "3 ", "1_0", "1e3", "0x10", "abc", "3.0",
                    str(INT64_MAX + 1), "9" * 40, "\x00", "\uff13"]  # fmt: skip


def test_compress_refuses_a_leaf_that_is_no_message_id(
    chats: dict[str, list[int]], tmp_path: Path
) -> None:
    """Compress now with a leaf that is not a message id (a superscript digit, zero, over
    2^63, spaces, signs): 400 naming the field, nothing enqueued."""
    http, csrf = operator()
    for leaf in MALFORMED_LEAVES:
        form = {"csrf": csrf, "conversation": "left", "leaf": leaf}
        answer = http.post("/ui/actions/compress", data=form, follow_redirects=False)
        assert answer.status_code == 400, (leaf, answer.status_code)
        assert one_line(answer.text).startswith("leaf must be a whole number from 1 to")
    assert sent(tmp_path) == 0


def test_compress_refuses_a_leaf_of_another_conversation(
    chats: dict[str, list[int]], tmp_path: Path
) -> None:
    """A message id of another conversation, or one that does not exist (2^63 - 1): 404
    saying the message is not in this conversation, nothing enqueued; a leaf of its own is
    sent."""
    http, csrf = operator()
    for leaf in (chats["right"][2], chats["theirs"][0], INT64_MAX, max(chats["right"]) + 1):
        form = {"csrf": csrf, "conversation": "left", "leaf": str(leaf)}
        answer = http.post("/ui/actions/compress", data=form, follow_redirects=False)
        assert answer.status_code == 404, (leaf, answer.status_code)
        assert f"message {leaf} is not in conversation 'left'" in one_line(answer.text)
    assert sent(tmp_path) == 0
    own = {"csrf": csrf, "conversation": "left", "leaf": str(chats["left"][3])}
    answer = http.post("/ui/actions/compress", data=own, follow_redirects=False)
    assert answer.status_code == 303 and f"leaf={chats['left'][3]}" in answer.headers["location"]
    assert sent(tmp_path) == 1


def test_the_page_refuses_a_leaf_that_is_not_one_of_its_messages(
    chats: dict[str, list[int]],
) -> None:
    """The conversation page's ``?leaf=`` follows the same rule: malformed is 400, another
    conversation's message or none is 404, never a silent stand-in or a 500."""
    http, _ = operator()
    for leaf in [*MALFORMED_LEAVES, str(chats["right"][1]), str(INT64_MAX)]:
        answer = http.get(conversation_path("left"), params={"leaf": leaf})
        if leaf in MALFORMED_LEAVES:
            assert answer.status_code == 400, (leaf, answer.status_code)
            assert one_line(answer.text).startswith("leaf must be a whole number")
        else:
            assert answer.status_code == 404, (leaf, answer.status_code)
            assert f"message {leaf} is not in conversation 'left'" == one_line(answer.text)
    assert http.get(conversation_path("left"), params={"leaf": chats["left"][2]}).status_code == 200


def test_every_field_of_every_page_and_action_has_one_rule(
    chats: dict[str, list[int]], tmp_path: Path
) -> None:
    """Each field with values outside its rule (ids, numbers, sorts, directions, search text,
    task ids): one line naming the field, 400 or 404, never a 500, nothing enqueued."""
    http, csrf = operator()
    page = conversation_path("left")
    cases: list[tuple[str, dict[str, str], int, str]] = [
        ("/ui/", {"page": "0"}, 400, "page must be a whole number"),
        ("/ui/", {"page": "²"}, 400, "page must be a whole number"),
        ("/ui/", {"size": "0"}, 400, "size must be a whole number from 1 to 200"),
        ("/ui/", {"size": "201"}, 400, "size must be a whole number from 1 to 200"),
        ("/ui/", {"size": "1e2"}, 400, "size must be"),
        ("/ui/", {"sort": "size"}, 400, "sort must be one of"),
        ("/ui/", {"dir": "up"}, 400, "dir must be desc or asc"),
        ("/ui/", {"q": "x" * 300}, 400, "q must be at most 255 characters"),
        ("/ui/", {"q": "a\x00b"}, 400, "q must be"),
        (page, {"enqueued": "<b>sent</b>"}, 400, "enqueued must be a task id"),
        (conversation_path("a\x00b"), {}, 404, "unknown conversation"),
        (conversation_path("x" * 300), {}, 404, "unknown conversation"),
    ]
    for path, params, status, line in cases:
        answer = http.get(path, params=params)
        assert answer.status_code == status, (path, params, answer.status_code)
        assert one_line(answer.text).startswith(line), (params, one_line(answer.text))
    for form in (
        {"conversation": ""},
        {"conversation": "a\x00b"},
        {"conversation": "no-such"},
        {"conversation": "x" * 300},
    ):
        for action in ("compress", "retry"):
            answer = http.post(f"/ui/actions/{action}", data={"csrf": csrf, **form})
            assert answer.status_code == 404, (action, form, answer.status_code)
            assert one_line(answer.text).startswith("unknown conversation")
    assert sent(tmp_path) == 0
    for params in ({"page": "2", "size": "10", "sort": "id", "dir": "asc", "q": "e"}, {}):
        assert http.get("/ui/", params=params).status_code == 200


FUZZ_PIECES = ["", "0", "1", "7", "-", "+", " ", "²", "٣", "\uff13", "_", ".", "e", "x", "\x00",
               "%", "'", '"', "<", "é", "\u202e", "9" * 25, str(INT64_MAX), "\n"]  # fmt: skip


def _fuzzed(rng: random.Random, valid: list[str]) -> str:
    if rng.random() < 0.25:
        return rng.choice(valid)
    return "".join(rng.choice(FUZZ_PIECES) for _ in range(rng.randint(0, 4)))


@pytest.mark.parametrize("seed", range(3))
def test_fuzzed_fields_never_fail_the_console(
    chats: dict[str, list[int]], tmp_path: Path, seed: int
) -> None:
    """Seeded random values for every field of the pages and actions: each answer is a page
    (200, 303, 400, 403 or 404), never a 500, and an action enqueues only when its
    conversation and leaf are both right."""
    rng = random.Random(seed)
    http, csrf = operator()
    ids = [str(mid) for mids in chats.values() for mid in mids]
    names = ["left", "right", "theirs", "none"]
    expected_sends = 0
    for _ in range(60):
        cid = _fuzzed(rng, names)
        leaf = _fuzzed(rng, ids)
        action = rng.choice(["compress", "retry", "page", "list", "logout"])
        if action == "page":
            params = {"leaf": leaf, "enqueued": _fuzzed(rng, [""]), "as_of": _fuzzed(rng, [""])}
            answer = http.get(conversation_path(cid or "left"), params=params)
        elif action == "list":
            params = {
                key: _fuzzed(rng, values)
                for key, values in (
                    ("page", ["1", "2"]), ("size", ["10", "200"]), ("sort", ["id", "pressure"]),
                    ("dir", ["asc", "desc"]), ("q", ["le", "%"]),
                )
            }  # fmt: skip
            answer = http.get("/ui/", params=params)
        else:
            form = {"csrf": _fuzzed(rng, [csrf]), "conversation": cid, "leaf": leaf}
            answer = http.post(f"/ui/{'logout' if action == 'logout' else 'actions/' + action}",
                               data=form, follow_redirects=False)  # fmt: skip
            right = (
                form["csrf"] == csrf
                and cid in chats
                and (action == "retry" or not leaf or leaf in map(str, chats[cid]))
            )
            if action != "logout" and right:
                expected_sends += 1
            if action == "logout" and form["csrf"] == csrf:  # logged out: log in again
                assert log_in(http, UI_KEY).status_code == 303
                csrf = csrf_of(http.get(conversation_path("left")).text)
        assert answer.status_code in (200, 303, 400, 403, 404), (action, answer.status_code)
    assert sent(tmp_path) == expected_sends


# --- logout, origin, headers -------------------------------------------------------------------


def test_logout_needs_the_csrf_token(chats: dict[str, list[int]]) -> None:
    """A logout without the session's CSRF token (a cross-site form), or with a wrong one, is
    refused and changes nothing: the cookie is kept and the session still opens pages; with
    the token the session ends on the server (its cookie no longer opens anything)."""
    http, csrf = operator()
    cookie = http.cookies.get("recap_console")
    assert cookie
    for form in ({}, {"csrf": "forged"}, {"csrf": "é" * 43}, {"csrf": csrf[:-1]}):
        answer = http.post("/ui/logout", data=form, follow_redirects=False)
        assert answer.status_code == 403, (form, answer.status_code)
        assert "set-cookie" not in answer.headers
        assert http.get("/ui/", follow_redirects=False).status_code == 200
    elsewhere = {"origin": "http://attacker.example"}
    answer = http.post("/ui/logout", data={"csrf": csrf}, headers=elsewhere)
    assert answer.status_code == 403
    assert http.get("/ui/", follow_redirects=False).status_code == 200
    done = http.post("/ui/logout", data={"csrf": csrf}, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == "/ui/login"
    replayed = client()
    replayed.cookies.set("recap_console", cookie)
    assert replayed.get("/ui/", follow_redirects=False).status_code == 303  # to the login


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("http://127.0.0.1", True),
        ("http://127.0.0.1:80", True),
        ("HTTP://127.0.0.1", True),
        ("https://127.0.0.1", False),
        ("https://127.0.0.1:80", False),
        ("http://127.0.0.1:8080", False),
        ("ws://127.0.0.1", False),
        ("http://127.0.0.1.attacker.example", False),
        ("http://127.0.0.1:x", False),
        ("null", False),
        ("", False),
    ],
)
def test_the_origin_check_compares_scheme_host_and_port(
    chats: dict[str, list[int]], tmp_path: Path, origin: str, allowed: bool
) -> None:
    """An action's Origin must be this console's scheme, host and port (default ports filled
    in): an https page of the same host is another origin for an http console."""
    http, csrf = operator()
    form = {"csrf": csrf, "conversation": "left"}
    answer = http.post(
        "/ui/actions/compress", data=form, headers={"origin": origin}, follow_redirects=False
    )
    assert answer.status_code == (303 if allowed else 403), answer.status_code
    assert sent(tmp_path) == (1 if allowed else 0)


def test_the_origin_check_follows_an_https_console(chats: dict[str, list[int]]) -> None:
    """Served over https (a TLS proxy that uvicorn trusts sets the scheme), the https origin
    is the console's own and the http one is not."""
    http = TestClient(standalone(), base_url="https://console.example")
    assert log_in(http, UI_KEY).status_code == 303
    csrf = csrf_of(http.get(conversation_path("left")).text)
    form = {"csrf": csrf, "conversation": "left", "leaf": "x"}  # refused after the origin check
    same = http.post(
        "/ui/actions/compress", data=form, headers={"origin": "https://console.example"}
    )
    assert same.status_code == 400
    other = http.post(
        "/ui/actions/compress", data=form, headers={"origin": "http://console.example"}
    )
    assert other.status_code == 403


def test_every_response_carries_the_security_headers(chats: dict[str, list[int]]) -> None:
    """Static files, pages, redirects, error pages and unknown paths all carry nosniff, the
    content-security policy and the frame refusal; static files may be cached (revalidated),
    pages may not."""
    http, _ = operator()
    answers = {
        "static css": http.get("/ui/static/console.css"),
        "static js": http.get("/ui/static/console.js"),
        "static chart": http.get("/ui/static/chart.umd.min.js"),
        "static missing": http.get("/ui/static/nothing.js"),
        "list": http.get("/ui/"),
        "login redirect": client().get("/ui/", follow_redirects=False),
        "root redirect": client().get("/", follow_redirects=False),
        "not found page": http.get(conversation_path("no-such")),
        "unknown path": http.get("/ui/no/such/path"),
        "wrong method": http.put("/ui/login"),
    }
    for name, answer in answers.items():
        headers = answer.headers
        assert headers.get("x-content-type-options") == "nosniff", name
        assert "default-src 'self'" in headers.get("content-security-policy", ""), name
        assert headers.get("x-frame-options") == "DENY", name
    assert answers["static css"].headers["content-type"].startswith("text/css")
    assert answers["static css"].headers["cache-control"] == "no-cache"
    assert answers["list"].headers["cache-control"] == "no-store"


# --- the login limit ---------------------------------------------------------------------------


def test_wrong_keys_are_limited_per_address(
    chats: dict[str, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After RECAP_UI_LOGIN_ATTEMPTS wrong keys from one address, the next try (even with the
    right key) is a 429 with Retry-After and one clear line, and opens no session; another
    address is not affected."""
    monkeypatch.setenv("RECAP_UI_LOGIN_ATTEMPTS", "3")
    get_settings.cache_clear()
    app = standalone()
    here = TestClient(app, base_url="http://127.0.0.1", client=("203.0.113.5", 5000))
    there = TestClient(app, base_url="http://127.0.0.1", client=("203.0.113.6", 5000))
    for _ in range(3):
        assert log_in(here, "not-the-key-at-all").status_code == 401
    limited = log_in(here, UI_KEY)
    assert limited.status_code == 429 and "set-cookie" not in limited.headers
    assert 1 <= int(limited.headers["retry-after"]) <= 300
    line = re.search(r'class="problem"[^>]*>([^<]*)<', limited.text)
    assert line and "too many wrong keys from this address" in line[1]
    assert log_in(there, UI_KEY).status_code == 303


def test_the_limiter_forgets_after_its_window() -> None:
    """The limiter's window slides: a wrong key older than the window no longer counts, a
    right key clears the address, and the addresses it remembers are bounded."""
    from recap.workers.ui import auth

    now = [1000.0]
    limiter = auth.LoginLimiter(2, window=60, clock=lambda: now[0])
    limiter.failed("a")
    now[0] += 30
    limiter.failed("a")
    assert limiter.wait("a") == 30 and limiter.wait("b") == 0
    now[0] += 30.5
    assert limiter.wait("a") == 0  # the first fell out of the window
    limiter.failed("a")
    assert limiter.wait("a") > 0
    limiter.succeeded("a")
    assert limiter.wait("a") == 0
    for index in range(auth.MAX_ADDRESSES + 5):
        limiter.failed(f"10.0.{index // 256}.{index % 256}")
    assert len(limiter._failures) == auth.MAX_ADDRESSES


# --- the request's totals --------------------------------------------------------------------


def test_the_page_gives_the_budget_in_provider_tokens_as_recap_timeline(
    chats: dict[str, list[int]],
) -> None:
    """After a provider reading below Recap's count, the page's request line gives the request
    and its budget in provider tokens, as `recap timeline --json` does (never a budget above
    the window), with Recap's own counts beside them."""
    from tests.support.cli_helpers import recap

    estimated = recap("assemble", "left", "--json").json()["tokens"]["total"]
    assert recap("usage", "left", "--prompt-tokens", str(int(estimated * 0.6))).code == 0
    line = recap("timeline", "left", "--json").json()
    assert line["calibration"] < 1 and line["budget"] <= line["window"]
    http, _ = operator()
    page = http.get(conversation_path("left")).text
    totals = re.search(
        r'data-testid="request-totals">([\d,]+) tokens of a budget of ([\d,]+)<', page
    )
    assert totals is not None, page
    shown_request, shown_budget = (int(value.replace(",", "")) for value in totals.groups())
    assert abs(shown_budget - line["budget"]) <= 1 and shown_budget <= line["window"]
    assert abs(shown_request - line["request_tokens"]) <= 1
    assert f"Recap's own count {line['estimated']['request_tokens']:,}" in html.unescape(page)
