"""The console's memory pages: the users with entries and one user's entries with the turn
that wrote each; a serve client key's session sees only its own users (another key's is a 404,
as its conversations are)."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine
from starlette.testclient import TestClient

from recap.core.client import Recap
from recap.core.memory.run import extract_memories
from recap.core.settings import get_settings
from recap.core.values.memory import serve_user
from recap.workers.serve.auth import fingerprint
from recap.workers.ui.app import standalone

UI_KEY = "console-operator-key-for-memory"
KEY_A, KEY_B = "client-key-memory-a", "client-key-memory-b"


@pytest.fixture
def http(sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> TestClient:
    monkeypatch.setenv("RECAP_UI_KEYS", UI_KEY)
    monkeypatch.setenv("RECAP_SERVE_KEYS", f"{KEY_A},{KEY_B}")
    monkeypatch.setenv("RECAP_MEMORY", "on")
    get_settings.cache_clear()
    return TestClient(standalone(), base_url="http://127.0.0.1")


def log_in(http: TestClient, key: str) -> None:
    assert http.post("/ui/login", data={"key": key}, follow_redirects=False).status_code == 303


def test_the_console_shows_a_users_memory_and_the_turn_that_wrote_it(http: TestClient) -> None:
    r = Recap(get_settings())
    amy_a, amy_b = serve_user(fingerprint(KEY_A), "amy"), serve_user(fingerprint(KEY_B), "amy")
    cid = r.new(model="gpt-4o-mini")
    r.add(cid, {"role": "user", "content": "my name is Amy <script>alert(1)</script>"})
    extract_memories(r.engine, r.settings, amy_a, cid)
    r.set_memory(amy_b, "units", "metric")
    log_in(http, UI_KEY)
    users = http.get("/ui/memory")
    assert users.status_code == 200 and amy_a in users.text and amy_b in users.text
    page = http.get(f"/ui/memory/u/{amy_a}")
    assert page.status_code == 200
    assert 'data-key="name"' in page.text and f"{cid} · message 1" in page.text
    assert "<script>alert" not in page.text  # escaped, as data
    # a client key's session: its own users, never another key's
    other = TestClient(standalone(), base_url="http://127.0.0.1")
    log_in(other, KEY_A)
    listing = other.get("/ui/memory")
    assert amy_a in listing.text and amy_b not in listing.text
    assert other.get(f"/ui/memory/u/{amy_a}").status_code == 200
    refused = other.get(f"/ui/memory/u/{amy_b}")
    assert refused.status_code == 404 and "metric" not in refused.text
    assert http.get("/ui/memory/u/").status_code == 404
