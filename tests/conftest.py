"""Shared fixtures: databases (SQLite, PostgreSQL), Redis (the shared server, a database of it held
alone, or a server of the test's own), RabbitMQ, settings, the test data.

Services that are absent make their tests skip with a reason, except under ``CI=true`` where an
absent service is a failure: CI must not go green without them.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text

from core.settings import Settings, get_settings
from core.storage.db import dispose_engines, make_engine
from core.storage.migrate import upgrade
from tests.support.services import (
    RabbitNode,
    RedisServer,
    missing_rabbitmq,
    missing_redis,
    postgres_database,
    redis_database,
)

DATA_DIR = Path(__file__).parent / "data"
DATA_FILES = (
    "swe_agent.jsonl",
    "openhands.jsonl",
    "tau_bench_airline.jsonl",
    "toolbench_examples.jsonl",
)
POSTGRES_ADMIN_URL = os.environ.get(
    "RECAP_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("RECAP_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
IN_CI = os.environ.get("CI", "").lower() == "true"


def need_service(name: str, reason: str) -> None:
    """Skip for a missing service, or fail under CI=true."""
    message = f"{name} is not available ({reason})"
    if IN_CI:
        pytest.fail(f"{message}; under CI=true this is a failure, not a skip")
    pytest.skip(message)


def load_data(name: str) -> list[dict[str, Any]]:
    """Every conversation of one test-data file."""
    with (DATA_DIR / name).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


@pytest.fixture(autouse=True)
def _fresh_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Each test reads settings anew, with outputs under its own folder and no .env."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RECAP_OUTPUT_DIR", str(tmp_path / "outputs"))
    monkeypatch.setenv("RECAP_BROKER_FOLDER", str(tmp_path / "broker"))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()
    dispose_engines()


@pytest.fixture
def settings() -> Settings:
    """The settings as the environment gives them."""
    return get_settings()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A fresh SQLite file, not yet migrated."""
    return f"sqlite:///{tmp_path / 'recap.db'}"


def _postgres_available() -> str | None:
    try:
        engine = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with engine.connect() as connection:
            connection.execute(text("select 1"))
        engine.dispose()
    except Exception as exc:  # any failure to connect means the server is not usable here
        return str(exc).splitlines()[0]
    return None


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database, dropped afterwards."""
    problem = _postgres_available()
    if problem is not None:
        need_service("PostgreSQL", problem)
    with postgres_database(POSTGRES_ADMIN_URL) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    """A fresh database of each kind, not yet migrated."""
    fixture = "sqlite_url" if request.param == "sqlite" else "postgres_url"
    return str(request.getfixturevalue(fixture))


def migrated(url: str, monkeypatch: pytest.MonkeyPatch) -> Engine:
    """A migrated engine for ``url``, also set as RECAP_DATABASE_URL."""
    monkeypatch.setenv("RECAP_DATABASE_URL", url)
    get_settings.cache_clear()
    engine = make_engine(url)
    upgrade(engine)
    return engine


@pytest.fixture
def engine(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Engine:
    """A migrated engine of each kind, also set as RECAP_DATABASE_URL."""
    return migrated(db_url, monkeypatch)


@pytest.fixture
def sqlite_engine(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Engine:
    """A migrated SQLite engine, also set as RECAP_DATABASE_URL."""
    return migrated(sqlite_url, monkeypatch)


@pytest.fixture
def redis_url() -> str:
    """The Redis server's URL, after checking that it answers."""
    try:
        import redis

        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except Exception as exc:  # any failure to reach Redis means it is not usable here
        need_service("Redis", str(exc).splitlines()[0])
    return REDIS_URL


@pytest.fixture
def private_redis_db(redis_url: str) -> Iterator[str]:
    """A database of the shared Redis server that this test holds alone (no concurrent run uses
    or flushes it), empty; its URL."""
    with redis_database(redis_url) as url:
        yield url


def need_redis_server() -> None:
    """Skip (fail under CI=true) where a Redis server of the test's own cannot be started."""
    problem = missing_redis()
    if problem is not None:
        need_service("redis-server", problem)


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A Redis server of the test's own; the senders ``compress_later`` cached for it are
    dropped afterwards."""
    need_redis_server()
    try:
        with RedisServer.started() as server:
            yield server
    finally:
        from workers.enqueue import reset

        reset()


_booting: list[RabbitNode] = []  # launched at collection, taken by the fixture below


def pytest_collection_finish(session: pytest.Session) -> None:
    """When a collected test needs RabbitMQ, launch its node now: it boots (seconds) while the
    tests before it run."""
    wanted = any(
        "rabbitmq_node" in getattr(item, "fixturenames", ())
        or "rabbitmq" in getattr(getattr(item, "callspec", None), "params", {}).values()
        for item in session.items
    )
    if wanted and missing_rabbitmq() is None:
        node = RabbitNode()
        node.launch()
        _booting.append(node)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A node launched for tests that never ran is stopped too."""
    while _booting:
        node = _booting.pop()
        node.stop()
        shutil.rmtree(node.folder, ignore_errors=True)


@pytest.fixture(scope="session")
def rabbitmq_node() -> Iterator[RabbitNode]:
    """A RabbitMQ node of this test run's own (``tests.support.services.RabbitNode``:
    rabbitmq-server on free ports, its own node name, cookie and folders), started once and shared
    by the tests that need RabbitMQ; each takes a fresh vhost. The machine's RabbitMQ is never
    touched."""
    problem = missing_rabbitmq()
    if problem is not None:
        need_service("RabbitMQ", problem)
    with RabbitNode.started(_booting.pop() if _booting else None) as node:
        yield node


@pytest.fixture
def amqp_url(rabbitmq_node: RabbitNode) -> str:
    """An ``amqp://`` URL on the test run's RabbitMQ node, in a vhost no other test uses."""
    return rabbitmq_node.url(rabbitmq_node.fresh_vhost())


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The worker suite on Redis and RabbitMQ alike (``tests/support/brokers.py``)."""
    from tests.support.brokers import parametrize_all_brokers

    parametrize_all_brokers(metafunc)
