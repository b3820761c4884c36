"""Secrets never leak: the one redaction step (tables and seeded random texts), then every sink
(CLI output, stored rows, events, task results, log lines) with a provider that echoes the key.
"""

from __future__ import annotations

import json
import os
import random
import threading
from pathlib import Path

import pytest
import redis
from pydantic import SecretStr
from sqlalchemy import Engine, select

from recap.core import service
from recap.core.redact import MASK, error_text, known_secrets, mask_value, redact
from recap.core.settings import Settings, load_settings
from recap.core.storage.db import session_scope
from recap.core.storage.models import CompactionLog, table_of
from tests.support.cli_helpers import recap, recap_process
from tests.support.llm_server import LLMServer, Reply
from tests.test_compress_worker import WINDOW, chat
from tests.test_operations import DB_PASSWORD, _wait, stack
from recap.workers.events import CHANNEL

LOG = table_of(CompactionLog)
KEY = "sk-proj-echoed0key0of0the0test0provider0wxyz"  # sk-shaped, as OpenAI's are
SEEDS = range(200)  # random texts per run: a few milliseconds each


# --- the redaction step ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Incorrect API key provided: sk-abcdefghijklmnop1234wxyz.",
            "Incorrect API key provided: sk-...wxyz.",
        ),
        ("sk-ant-api03-abcdefghijklmnopqrstuv1234", "sk-ant-...1234"),
        ("key sk-short", "key sk-short"),
        ("redis://:s3cret@host:6379/0", "redis://:***@host:6379/0"),
        ("postgresql+psycopg://app:p%40ss@db/recap", "postgresql+psycopg://app:***@db/recap"),
        ("amqp://guest:guest@rabbit//", "amqp://guest:***@rabbit//"),
        ("redis://host:6379/0 has no password", "redis://host:6379/0 has no password"),
        ("Authorization: Bearer eyJhbGciOi.J9x-1_2", "Authorization: Bearer ***"),
        ("Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic ***"),
        ('{"api_key": "abc", "model": "gpt-4o"}', '{"api_key": "***", "model": "gpt-4o"}'),
        ("api-key=abc&x=1", "api-key=***&x=1"),
        ("password: hunter2", "password: ***"),
        ("client_secret='xyz'", "client_secret='***'"),
        ("cache_key=abc", "cache_key=abc"),
        ("cache_key=0123456789abcdef0123", "cache_key=***"),
        ("Incorrect API key provided: 0123456789abcdef0123", "Incorrect API key provided: ***"),
        ("token limit reached: 4096 tokens", "token limit reached: 4096 tokens"),
        ("the key conversation-one is unknown", "the key conversation-one is unknown"),
        (
            "summary rejected: does not reduce the 49-188 tokens",
            "summary rejected: does not reduce the 49-188 tokens",
        ),
        ("a basic answer, bearer of news", "a basic answer, bearer of news"),
        ("", ""),
    ],
)
def test_redact_masks_key_shapes_and_keeps_the_rest(text: str, expected: str) -> None:
    """Each key shape is masked, keeping the parts that help a diagnosis; plain text is kept."""
    assert redact(text) == expected
    assert redact(expected) == expected  # masking twice changes nothing


@pytest.mark.parametrize(
    ("secret", "masked"),
    [
        ("sk-abcdefghijklmnopqrstu1234", "sk-...1234"),
        ("sk-ant-abcdefghijklmnopqr1234", "sk-ant-...1234"),
        ("plain-long-password-value-1234", MASK),
        ("short", MASK),
    ],
)
def test_known_secrets_are_masked_anywhere(secret: str, masked: str) -> None:
    """A known secret is masked wherever it stands, even inside a word."""
    assert mask_value(secret) == masked
    assert redact(f"x{secret}y and {secret}", [secret]) == f"x{masked}y and {masked}"


def test_short_or_missing_secrets_mask_nothing() -> None:
    """None and secrets under four characters would mask ordinary words: they are skipped."""
    assert redact("a bc def", [None, "", "bc"]) == "a bc def"


WORDS = (
    "the",
    "model",
    "failed",
    "retry",
    "after",
    "tokens",
    "summary",
    "error:",
    "(",
    ")",
    "conversation",
    "c-12",
    "429",
    "at",
    "line",
    "3",
    "ok.",
    "\n",
)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_texts_lose_exactly_their_secrets(seed: int) -> None:
    """Random plain sentences with a known secret spliced in at random places: the result is the
    sentence with each occurrence replaced by the secret's mask, and nothing else changed."""
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
    secret = rng.choice(["sk-", "sk-ant-", ""]) + "".join(
        rng.choices(alphabet, k=rng.randint(8, 40))
    )
    parts = [rng.choice(WORDS) for _ in range(rng.randint(0, 30))]
    for _ in range(rng.randint(1, 3)):
        parts.insert(rng.randint(0, len(parts)), secret)
    text = " ".join(parts)
    expected = " ".join(mask_value(secret) if p == secret else p for p in parts)
    assert redact(text, [secret]) == expected
    assert secret not in redact(text, [secret])


@pytest.mark.parametrize(
    "text",
    [
        "a" * 200_000,
        "key " * 50_000,
        "sk-" * 60_000,
        "x://" * 50_000,
        "api_key" * 30_000,
        "key: " * 40_000,
        "a:b@" * 50_000,
        "Bearer " * 30_000,
        "=" * 200_000,
    ],
)
def test_pathological_inputs_finish(text: str) -> None:
    """Inputs built to make a regex backtrack are masked in one pass (linear patterns); a
    quadratic pattern would take minutes on these, so the test would not finish in time."""
    assert isinstance(redact(text), str)


def test_known_secrets_are_found_from_the_settings_fields() -> None:
    """The summary key, every URL password (raw and percent-encoded), and any field named like a
    key, keys, password or secret that later work adds, found from the fields themselves."""

    class Extended(Settings):
        mirror_api_key: SecretStr | None = None
        hook_keys: str = ""
        flower_password: str | None = None

    settings = Extended(
        summary_api_key=SecretStr("sk-summary-0123456789abcdef"),
        database_url="postgresql+psycopg://app:p%40ss-word@db/recap",
        broker_url="redis://:broker-pass@redis:6379/0",
        result_backend="redis://user:backend-pass@redis:6379/1",
        mirror_api_key=SecretStr("mirror-key-123"),
        hook_keys="client-one-key, client-two-key",
        flower_password="flower-pass",
        default_model="gpt-4o-mini",
    )
    found = set(known_secrets(settings))
    assert {
        "sk-summary-0123456789abcdef",
        "p@ss-word",
        "p%40ss-word",
        "broker-pass",
        "backend-pass",
        "mirror-key-123",
        "client-one-key",
        "client-two-key",
        "flower-pass",
    } <= found
    assert "gpt-4o-mini" not in found and "redis" not in found
    assert known_secrets(load_settings()) == []


def test_error_text_is_one_masked_line() -> None:
    """The class and the masked message on one line; no traceback; cut after masking."""
    try:
        raise ValueError(f"first line\nIncorrect API key provided: {KEY}\n  more")
    except ValueError as exc:
        text = error_text(exc, [KEY])
    assert text == "ValueError: first line Incorrect API key provided: sk-...wxyz more"
    assert error_text(RuntimeError()) == "RuntimeError"
    long = error_text(RuntimeError("x" * 5_000 + KEY), [KEY])
    assert len(long) <= 1_000 and KEY[:12] not in long


# --- every sink, with a provider that echoes the key ------------------------------------------


def echo_401() -> Reply:
    """What OpenAI answers a wrong key: the key itself, in the message."""
    return Reply(status=401, error=f"Incorrect API key provided: {KEY}. You can find your key.")


def _rows(engine: Engine) -> str:
    with session_scope(engine) as session:
        rows = session.connection().execute(select(LOG)).all()
    return json.dumps([list(map(str, row)) for row in rows])


class Listener:
    """Every message published on the events channel while it listens."""

    def __init__(self, url: str) -> None:
        self.messages: list[str] = []
        self._pubsub = redis.Redis.from_url(url).pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(CHANNEL)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._stop = threading.Event()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self._pubsub.get_message(timeout=0.1)
            if message is not None:
                self.messages.append(message["data"].decode())

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._pubsub.close()


def test_a_key_echoed_by_the_provider_reaches_no_sink(
    postgres_url: str, redis_url: str, tmp_path: Path
) -> None:
    """A worker process on Redis (broker and result backend) over PostgreSQL with a password in
    its URL: a 401 that quotes the key leaves it in no log line, row, event or stored result,
    and neither the database password; the masked reason is in each, so the test sees them."""
    with stack(postgres_url, redis_url, tmp_path, RECAP_SUMMARY_API_KEY=KEY) as s:
        listener = Listener(s.redis_url)
        try:
            cid = s.new_conversation()
            s.server.script(echo_401())
            from celery import Celery

            client = Celery(broker=s.redis_url, backend=s.redis_url)
            result = client.send_task("recap.compress_session", args=[cid], queue="compress")
            error = result.get(timeout=90, propagate=False)
            assert result.state == "FAILURE", result.state
            assert s.server.requests[0].headers.get("authorization") == f"Bearer {KEY}"
            _wait(lambda: any("compression_failed" in m for m in listener.messages), 30, "event")
            stored = [
                value
                for key in redis.Redis.from_url(s.redis_url).keys("celery-task-meta-*")
                if (value := redis.Redis.from_url(s.redis_url).get(key))
            ]
            client.close()
            _wait(lambda: b"task_done" in s.worker_log.read_bytes(), 30, "the canonical line")
        finally:
            listener.close()
        sinks = {
            "exception": str(error),
            "result backend": b"".join(stored).decode(),
            "events": "\n".join(listener.messages),
            "rows": _rows(s.engine),
            "worker log": s.worker_log.read_text(),
        }
    for name, text in sinks.items():
        assert "sk-...wxyz" in text, f"the masked reason is missing from the {name}"
        assert KEY not in text, f"the key leaked into the {name}"
        assert DB_PASSWORD not in text, f"the database password leaked into the {name}"


def test_cli_compress_masks_the_echoed_key(
    sqlite_engine: Engine, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`recap compress` in this process, JSON and human output, with progress logs on: the
    failed result and every line on stdout and stderr hold the masked key, never the key."""
    server = LLMServer().start()
    try:
        monkeypatch.setenv("RECAP_SUMMARY_MODEL", "openai/stand-in")
        monkeypatch.setenv("RECAP_SUMMARY_API_BASE", server.url)
        monkeypatch.setenv("RECAP_SUMMARY_API_KEY", KEY)
        service.import_conversations(
            sqlite_engine, [{"id": "c", "messages": chat(12)}], settings, max_input_tokens=WINDOW
        )
        server.script(echo_401())
        outputs = [recap("compress", "c", "--json")]
        wide = {**os.environ, "COLUMNS": "1000"}  # the human table on one line per row
        for args in (("-v", "compress", "c"), ("failures",)):
            server.script(echo_401())
            outputs.append(recap_process(*args, env=wide))
    finally:
        server.stop()
    as_json, human, listed = outputs
    assert as_json.code != 0 and json.loads(as_json.stdout)["action"] == "failed"
    assert human.code != 0 and listed.code == 0
    for result in outputs:
        text = result.stdout + result.stderr
        assert KEY not in text, text
        assert "Traceback" not in text, text
    assert "compression_failed" in human.stderr  # the progress log line, masked too
    for text in (as_json.stdout, human.stdout, human.stderr, listed.stdout):
        assert "sk-...wxyz" in text, text
    assert KEY not in _rows(sqlite_engine) and "sk-...wxyz" in _rows(sqlite_engine)


def test_cli_error_lines_are_masked(sqlite_engine: Engine) -> None:
    """An error line that quotes a secret (here a conversation id shaped like a key) is masked."""
    result = recap("stats", KEY)
    assert result.code != 0 and KEY not in result.stderr and "sk-...wxyz" in result.stderr
