"""What the worker benchmarks run against: a fresh PostgreSQL database on the shared server, and a
broker of the benchmark's own (a Redis server or a RabbitMQ node on free ports)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

POSTGRES_ADMIN_URL = os.environ.get(
    "RECAP_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@contextmanager
def database() -> Iterator[str]:
    """A fresh PostgreSQL database on the shared server, dropped afterwards."""
    from tests.support.services import postgres_database

    with postgres_database(POSTGRES_ADMIN_URL, prefix="recap_load_") as url:
        yield url


@contextmanager
def broker(kind: str) -> Iterator[str]:
    """A broker of the benchmark's own: a Redis server, or a RabbitMQ node (a fresh vhost)."""
    from tests.support.services import RabbitNode, RedisServer
    from workers.enqueue import reset

    try:
        if kind == "redis":
            with RedisServer.started() as server:
                yield server.url
        else:
            with RabbitNode.started() as node:
                yield node.url(node.fresh_vhost())
    finally:
        reset()
