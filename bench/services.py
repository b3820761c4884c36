"""What the benchmarks run against: a fresh PostgreSQL database on the machine's server, and a
broker of the benchmark's own (a Redis server or a RabbitMQ node on free ports).

Unlike the suite, the benchmarks use the machine's running PostgreSQL and Redis (``bench.large``
keeps its million-message database there between runs): the server ``RECAP_TEST_POSTGRES_URL`` /
``RECAP_TEST_REDIS_URL`` names, else the local test servers below. They write only to databases
they create for the run (dropped afterwards, ``recap_bench_large`` aside) and to Redis database
numbers they claim and empty (``tests.support.services.redis_database``); these are the only
defaults of the two settings in ``bench/``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.services import POSTGRES_SETTING, REDIS_SETTING

MACHINE_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
MACHINE_REDIS_URL = "redis://127.0.0.1:6379/0"
POSTGRES_ADMIN_URL = os.environ.get(POSTGRES_SETTING) or MACHINE_POSTGRES_URL
REDIS_URL = os.environ.get(REDIS_SETTING) or MACHINE_REDIS_URL


@contextmanager
def database() -> Iterator[str]:
    """A fresh PostgreSQL database on the machine's server, dropped afterwards."""
    from tests.support.services import postgres_database

    with postgres_database(POSTGRES_ADMIN_URL, prefix="recap_load_") as url:
        yield url


@contextmanager
def broker(kind: str) -> Iterator[str]:
    """A broker of the benchmark's own: a Redis server, or a RabbitMQ node (a fresh vhost)."""
    from tests.support.services import RabbitNode, RedisServer
    from recap.workers.enqueue import reset

    try:
        if kind == "redis":
            with RedisServer.started() as server:
                yield server.url
        else:
            with RabbitNode.started() as node:
                yield node.url(node.fresh_vhost())
    finally:
        reset()
