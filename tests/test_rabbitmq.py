"""RabbitMQ as a broker: the queues Recap declares there, what ``compress_later`` puts on them,
and a real ``recap worker`` retrying through the broker and surviving its restart.

The broker is a RabbitMQ node of the test run's own (``rabbitmq_node`` in conftest: started on
free ports, a fresh vhost per test), never the machine's server. With ``tests/test_routing.py``
(a plain ``send_task`` by name and ``compress_later`` served) and every worker test that takes
the ``broker`` fixture (``tests/support/brokers.py``: test_compress_worker, test_failures,
test_media_worker), the worker suite runs on RabbitMQ as well as Redis. The restart test
comes last: it restarts the node.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import amqp
import pytest
import structlog
from kombu import Connection

from recap.core.settings import Settings, load_settings
from tests.support.cli_helpers import assert_one_line_error, recap_process
from tests.support.llm_server import Reply
from tests.support.services import RabbitNode
from tests.support.worker_stack import ROOT, wait_for
from tests.test_restarts import Stack, held_run, stack_on
from recap.workers import enqueue, events
from recap.workers.app import (
    COMPRESS_QUEUE,
    DEFAULT_QUEUE,
    MAINTENANCE_QUEUE,
    celery_config,
    whole_countdown,
)
from recap.workers.enqueue import compress_later

AMQP = "amqp://guest:guest@rabbit:5672//"
REDIS = "redis://redis:6379/0"


def config(broker: str, **values: Any) -> dict[str, Any]:
    return celery_config(load_settings(broker_url=broker, **values))


def queues(conf: dict[str, Any]) -> dict[str, Any]:
    return {queue.name: queue for queue in conf["task_queues"]}


# --- the configuration -------------------------------------------------------------------------


def test_rabbitmq_gets_quorum_queues_confirms_and_an_ack_timeout() -> None:
    """compress and maintenance are durable quorum queues on topic exchanges, publishes are
    confirmed, and their consumers ask for an ack timeout above the task's hard limit."""
    settings = load_settings(broker_url=AMQP)
    conf = celery_config(settings)
    assert conf["broker_transport_options"] == {"confirm_publish": True}
    assert conf["worker_detect_quorum_queues"] is True
    assert conf["task_acks_late"] is True and conf["worker_prefetch_multiplier"] == 1
    by_name = queues(conf)
    for name in (COMPRESS_QUEUE, MAINTENANCE_QUEUE):
        queue = by_name[name]
        assert queue.durable and not queue.auto_delete
        assert queue.queue_arguments == {"x-queue-type": "quorum"}
        assert (queue.exchange.name, queue.exchange.type, queue.routing_key) == (
            name,
            "topic",
            name,
        )
    timeout_ms = by_name[COMPRESS_QUEUE].consumer_arguments["x-consumer-timeout"]
    assert timeout_ms / 1000 > settings.task_time_limit + settings.retry_backoff_max
    assert conf["task_default_exchange_type"] == "topic"


def test_the_default_queue_is_what_a_plain_celery_app_declares() -> None:
    """`celery` stays classic on a direct exchange (a plain Celery app redeclares it so; any
    other declaration would be refused), on RabbitMQ as on Redis."""
    for broker in (AMQP, REDIS):
        queue = queues(config(broker))[DEFAULT_QUEUE]
        assert not queue.queue_arguments
        assert (queue.exchange.type, queue.routing_key, queue.durable) == ("direct", "celery", True)


def test_redis_keeps_its_direct_queues_and_visibility_timeout() -> None:
    """Nothing of the RabbitMQ setup reaches a Redis broker."""
    settings = load_settings(broker_url=REDIS, result_backend=REDIS)
    conf = celery_config(settings)
    assert conf["broker_transport_options"] == {"visibility_timeout": settings.visibility_timeout}
    assert conf["result_backend_transport_options"] == conf["broker_transport_options"]
    for queue in conf["task_queues"]:
        assert queue.exchange.type == "direct"
        assert not queue.queue_arguments and not queue.consumer_arguments
    assert conf["task_default_exchange_type"] == "direct"


def test_classic_queue_type_for_older_servers() -> None:
    """RECAP_AMQP_QUEUE_TYPE=classic: durable classic queues on direct exchanges (Celery then
    keeps global QoS and delays retries in the worker)."""
    for queue in config(AMQP, amqp_queue_type="classic")["task_queues"]:
        assert not queue.queue_arguments and queue.exchange.type == "direct"
        assert not queue.consumer_arguments  # the server's consumer_timeout applies


def test_an_unknown_queue_type_is_a_clear_settings_error() -> None:
    """Only quorum and classic are accepted."""
    with pytest.raises(ValueError, match="RECAP_AMQP_QUEUE_TYPE"):
        load_settings(amqp_queue_type="stream")


@pytest.mark.parametrize(
    ("countdown", "sent"),
    [(None, None), (0, 0), (0.2, 1.0), (0.999, 1.0), (1, 1.0), (1.01, 2.0), (30.5, 31.0)],
)
def test_native_delays_are_whole_seconds_of_at_least_one(
    countdown: float | None, sent: float | None
) -> None:
    """A fractional backoff is rounded up: the delayed-delivery exchanges count whole seconds."""
    assert whole_countdown(countdown) == sent


def test_events_are_logged_not_published_on_rabbitmq() -> None:
    """The Redis event channel is Redis-only: on RabbitMQ an event is a log line and nothing
    tries to reach a Redis server."""
    settings = Settings(broker_url=AMQP)
    assert not events.publishes(settings)
    with structlog.testing.capture_logs() as logs:
        events.emit(settings, events.STARTED, conversation_id="c")
    assert [entry["event"] for entry in logs] == [events.STARTED]


# --- compress_later on a real node -------------------------------------------------------------


@pytest.fixture
def rabbit(amqp_url: str) -> Iterator[str]:
    yield amqp_url
    enqueue.reset()


def _get(url: str, queue: str) -> amqp.basic_message.Message | None:
    with Connection(url) as connection:
        channel = connection.default_channel
        return channel.basic_get(queue, no_ack=True)  # type: ignore[no-any-return]


def test_compress_later_publishes_a_persistent_message_on_the_quorum_queue(rabbit: str) -> None:
    """The message is on `compress` (a quorum queue: a classic redeclaration is refused), marked
    persistent, JSON, named and argued as the task; nothing is on `celery`."""
    task_id = compress_later("conv-1", 7, broker_url=rabbit)
    with Connection(rabbit) as connection:
        channel = connection.default_channel
        with pytest.raises(amqp.exceptions.PreconditionFailed, match="x-queue-type"):
            channel.queue_declare(COMPRESS_QUEUE, durable=True, auto_delete=False)
    message = _get(rabbit, COMPRESS_QUEUE)
    assert message is not None
    assert message.properties["delivery_mode"] == 2
    assert message.properties["content_type"] == "application/json"
    headers = message.properties["application_headers"]
    assert (headers["task"], headers["id"]) == ("recap.compress_session", task_id)
    args, kwargs, _ = json.loads(message.body)
    assert (args, kwargs) == (["conv-1"], {"leaf_message_id": 7})


def test_a_refused_rabbitmq_login_is_one_clear_line(
    rabbitmq_node: RabbitNode, sqlite_engine: Any
) -> None:
    """A wrong RabbitMQ password (the broker refuses the login, which kombu does not wrap) is
    one line naming the broker setting, no traceback, and the password is not in it."""
    url = f"amqp://guest:wrong-pass@127.0.0.1:{rabbitmq_node.port}//"
    env = {**os.environ, "RECAP_BROKER_URL": url, "PYTHONPATH": str(ROOT)}
    result = recap_process("reconcile", env=env)
    assert_one_line_error(result, "cannot reach the broker (RECAP_BROKER_URL)")
    assert "ACCESS_REFUSED" in result.stderr and "wrong-pass" not in result.stderr


# --- a real recap worker on RabbitMQ ----------------------------------------------------------


@dataclass
class RabbitBroker:
    """One vhost of the test run's node; a restart restarts the node (our own, by its pid)."""

    node: RabbitNode
    vhost: str

    @property
    def url(self) -> str:
        return self.node.url(self.vhost)

    def restart(self) -> None:
        self.node.restart()


@pytest.fixture(scope="module")
def rabbit_stack(
    rabbitmq_node: RabbitNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """`recap worker --queues compress --concurrency 1` on a fresh vhost and SQLite, calling the
    gated model server. One thread and prefetch one: while it holds a run in the model call, a
    second task waits in the queue itself."""
    tmp = tmp_path_factory.mktemp("rabbit-stack")
    broker = RabbitBroker(rabbitmq_node, rabbitmq_node.fresh_vhost())
    args = ("--queues", "compress", "--concurrency", "1")
    with stack_on(broker, tmp, f"sqlite:///{tmp / 'recap.db'}", worker_args=args) as stack:
        yield stack


def _ready_in_queue(url: str, queue: str) -> int:
    """Messages waiting in the queue (not delivered to a consumer)."""
    with Connection(url) as connection:
        _, ready, _ = connection.default_channel.queue_declare(queue, passive=True)
        return int(ready)


def test_retries_wait_in_the_brokers_delayed_delivery(rabbit_stack: Stack) -> None:
    """A 429 and a 500 with sub-second backoff are retried through RabbitMQ's delayed-delivery
    exchanges (whole seconds) back to the compress queue: two retries, then one summary."""
    s = rabbit_stack
    cid = s.new()
    calls = len(s.server.requests)
    s.server.script(Reply(status=429), Reply(status=500))
    s.enqueue(cid)
    s.wait_summary(cid)
    assert s.actions(cid) == ["retry", "retry", "summarized"]
    assert len(s.server.requests) > calls + 2  # the two failures, then the summary's calls
    assert "Native delayed delivery will not be available" not in s.worker.text()


def test_a_rabbitmq_restart_loses_no_task_and_the_worker_reconnects(rabbit_stack: Stack) -> None:
    """RabbitMQ restarts while one run waits on the model and another task waits in the queue:
    the queued task is still there after the restart (durable queue, persistent message) and is
    served, the held run finishes once (one summary each, leases let go), and the same worker
    child reconnects and serves what is enqueued after."""
    s = rabbit_stack
    children = s.worker.children()
    held = held_run(s)
    queued = s.new()
    s.enqueue(queued)
    wait_for(lambda: _ready_in_queue(s.broker.url, COMPRESS_QUEUE) == 1, 30, "the queued task")
    s.broker.restart()
    s.gate.open()
    s.wait_summary(held)
    s.wait_summary(queued)
    s.served_after()
    s.assert_one_summary_and_free(held)
    s.assert_one_summary_and_free(queued)
    assert s.worker.children() == children, s.worker.text()[-3000:]
    assert "Unrecoverable error" not in s.worker.text()
