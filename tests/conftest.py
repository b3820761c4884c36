"""Shared fixtures: databases (SQLite, PostgreSQL), Redis (the test run's server, a database of
it held alone, or a server of the test's own), RabbitMQ, settings.

PostgreSQL and Redis are servers of the test run's own (``tests.support.services.SUITE``), started
on first use when ``initdb``/``pg_ctl`` and ``redis-server`` are on PATH, unless
``RECAP_TEST_POSTGRES_URL`` / ``RECAP_TEST_REDIS_URL`` name running servers to use instead: the
suite never writes to a machine's own databases unless told to. Services that are absent make
their tests skip with a reason, except under ``CI=true`` where an absent service is a failure: CI
must not go green without them.
"""

from __future__ import annotations

import gc
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from recap.core.settings import Settings, get_settings
from recap.core.storage.db import dispose_engines
from tests.support.data import migrated
from tests.support.services import (
    SUITE,
    RabbitNode,
    RedisServer,
    Unavailable,
    missing_rabbitmq,
    need_redis_server,
    need_service,
    postgres_database,
    redis_database,
)

pytest_plugins = ("tests.support.serving",)  # the serve test modules' shared fixtures


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


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    """The PostgreSQL server the tests make their databases on: a private cluster of this run,
    or the server ``RECAP_TEST_POSTGRES_URL`` names."""
    try:
        return SUITE.postgres_admin_url()
    except Unavailable as exc:
        need_service("PostgreSQL", str(exc))


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database, dropped afterwards."""
    with postgres_database(postgres_admin_url) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    """A fresh database of each kind, not yet migrated."""
    fixture = "sqlite_url" if request.param == "sqlite" else "postgres_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
def engine(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Engine:
    """A migrated engine of each kind, also set as RECAP_DATABASE_URL."""
    return migrated(db_url, monkeypatch)


@pytest.fixture
def sqlite_engine(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Engine:
    """A migrated SQLite engine, also set as RECAP_DATABASE_URL."""
    return migrated(sqlite_url, monkeypatch)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The URL of this run's Redis server (database 0): a private redis-server, or the server
    ``RECAP_TEST_REDIS_URL`` names."""
    try:
        return SUITE.redis_url()
    except Unavailable as exc:
        need_service("Redis", str(exc))


@pytest.fixture
def private_redis_db(redis_url: str) -> Iterator[str]:
    """A database of the run's Redis server that this test holds alone (no concurrent run uses
    or flushes it), empty; its URL."""
    with redis_database(redis_url) as url:
        yield url


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A Redis server of the test's own; the senders ``compress_later`` cached for it are
    dropped afterwards."""
    need_redis_server()
    try:
        with RedisServer.started() as server:
            yield server
    finally:
        from recap.workers.enqueue import reset

        reset()


# The files that take longest (summed test time in a whole run, longest first), run first: the
# workers (``--dist loadfile`` hands out whole files in collection order) then end on short files
# together instead of one worker running a long file alone at the end.
LONGEST_FIRST = (
    "test_quality",
    "test_hostile_cli",
    "test_compress_worker",
    "test_serve_hostile_apis",
    "test_serve_hostile",
    "test_console_browser",
    "test_serve",
    "test_scale",
    "test_serve_apis",
    "test_bad_input",
    "test_serve_recall",
    "test_failures",
    "test_restarts",
    "test_erasure_race",
    "test_secrets",
    "test_fidelity",
    "test_serve_native",
    "test_frameworks",
    "test_metrics_serve",
    "test_open_responses",
    "test_serve_cache_key",
    "test_rabbitmq",
    "test_replay",
    "test_write_contention",
    "test_erasure_race_serve",
    "test_provider_compaction",
    "test_serve_tenancy",
    "test_console_hardening",
    "test_metrics_worker",
    "test_frameworks_loop",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first (``LONGEST_FIRST``), each file's tests in their own order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    last = len(rank)
    order = {id(item): n for n, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(item.path.stem, last), order[id(item)]))


@pytest.fixture(scope="module", autouse=True)
def _collect_after_module() -> Iterator[None]:
    """Garbage collected after each test file, outside any event loop. An async HTTP client
    left open (the OpenAI SDK's, made by a framework inside ``run_sync``) closes itself when
    collected by scheduling ``aclose`` on the running loop; collected during a later file's
    async test, that is the later test's loop, where closing connections of a loop that is gone
    fails that test. Collected here, no loop is running and nothing is scheduled."""
    yield
    gc.collect()


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
    """The run's private PostgreSQL and Redis are stopped, and a RabbitMQ node launched for tests
    that never ran."""
    SUITE.stop()
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
