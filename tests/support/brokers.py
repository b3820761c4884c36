"""The brokers the worker tests run on: Redis, and RabbitMQ.

A test module defines a ``broker`` fixture as ``broker_url_for(request)``, and every test that
takes it runs on both brokers (ids ``[redis]`` and ``[rabbitmq]``, from ``pytest_generate_tests``
in conftest) unless it names its broker through an indirect parametrization. Redis is the test
run's server (a key prefix of the test's own, from ``configured_app``); RabbitMQ is a fresh vhost
of the test run's node (``amqp_url`` in conftest: a skip with a reason where RabbitMQ is absent, a
failure under ``CI=true``). Results are kept in Redis on both, as a deployment on RabbitMQ would
keep them in a result backend of its own.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.services import SUITE
from recap.workers.app import is_redis

BROKERS = ("redis", "rabbitmq")


def parametrize_all_brokers(metafunc: pytest.Metafunc) -> None:
    """Every test that takes the ``broker`` fixture without naming its broker runs on each of
    them, ids ``[redis]`` and ``[rabbitmq]`` (``pytest_generate_tests`` calls this)."""
    if "broker" not in metafunc.fixturenames:
        return
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0]
        named = names.replace(" ", "").split(",") if isinstance(names, str) else list(names)
        if "broker" in named:
            return
    metafunc.parametrize("broker", BROKERS, indirect=True)


def broker_url_for(request: pytest.FixtureRequest) -> str:
    """The broker URL for the fixture's parameter (``redis`` when there is none). Redis is
    checked on both: it keeps the results."""
    redis_url = str(request.getfixturevalue("redis_url"))
    if getattr(request, "param", "redis") == "redis":
        return redis_url
    return str(request.getfixturevalue("amqp_url"))


def result_backend_for(broker_url: str) -> str:
    """The broker itself on Redis; the run's Redis server beside RabbitMQ (``broker_url_for``
    has found it already)."""
    return broker_url if is_redis(broker_url) else SUITE.redis_url()


def stop_promptly(worker: Any) -> None:
    """Ask an in-process worker (``start_worker``) to stop and wake its event loop, which on an
    idle RabbitMQ connection sleeps up to 10 s until its next timer: ``start_worker`` then joins
    a thread that is already leaving."""
    from celery.worker import state

    state.should_terminate = 0
    hub = getattr(worker, "hub", None)
    if hub is not None:
        hub.call_soon(lambda: None)  # from another thread: wakes the loop
