"""Routing: the plainest ``send_task`` by name reaches a worker, and ``compress_later`` cannot get
the queue wrong.

The compress worker consumes the ``compress`` queue and Celery's default queue ``celery``, so a
host that builds a bare ``Celery(broker=URL)`` and sends ``recap.compress_session`` by name is
served (issue: 200 of 200 such tasks used to sit unconsumed until reconcile). The worker is a real
``recap worker`` process, with the offline summarizer, on a broker of the test's own: a Redis
server, and a vhost of the test run's RabbitMQ node (where ``celery`` must stay the queue a plain
Celery app declares, and ``compress`` is a quorum queue).
"""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from recap.core import service
from recap.core.settings import get_settings
from recap.core.storage.db import make_engine
from recap.core.storage.migrate import upgrade
from recap.workers import enqueue
from recap.workers.app import COMPRESS_QUEUE, DEFAULT_QUEUE, MAINTENANCE_QUEUE, MEMORY_QUEUE
from recap.workers.enqueue import compress_later
from recap.workers.runner import worker_argv
from tests.support.services import RedisServer
from tests.support.worker_stack import WorkerProcess, wait_for, worker_env

WINDOW = 3_000  # small, so a dozen short turns go over the trigger
SERVED_TIMEOUT = 60.0  # one compression by a running worker, with room for a loaded machine


def chat(turns: int, tag: str) -> list[dict[str, str]]:
    messages = []
    for n in range(turns):
        for role in ("user", "assistant"):
            words = " ".join(f"{role}{n}{tag}w{i}" for i in range(30))
            messages.append({"role": role, "content": f"[{role} {n}] src/r_{n}.py {words}"})
    return messages


@pytest.mark.parametrize(
    ("queue", "consumed"),
    [
        (COMPRESS_QUEUE, f"{COMPRESS_QUEUE},{DEFAULT_QUEUE},{MEMORY_QUEUE}"),
        (MAINTENANCE_QUEUE, MAINTENANCE_QUEUE),
    ],
)
def test_the_compress_worker_also_consumes_the_default_queue(queue: str, consumed: str) -> None:
    """`recap worker` gives the compress worker Celery's default queue and the memory queue
    too; maintenance not."""
    argv = worker_argv(queue, beat=False, extra=())
    assert argv[argv.index("--queues") + 1] == consumed


@pytest.mark.parametrize(
    ("conversation_id", "leaf"),
    [("", None), (None, None), (42, None), ("c", "7"), ("c", True), ("c", 1.5)],
)
def test_compress_later_refuses_bad_arguments(conversation_id: Any, leaf: Any) -> None:
    """A wrong id or leaf is a ValueError before anything is sent."""
    with pytest.raises(ValueError):
        compress_later(conversation_id, leaf, broker_url="memory://")


def _queued(url: str, queue: str) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(url)
    return [json.loads(raw) for raw in client.lrange(queue, 0, -1)]


@pytest.mark.parametrize(
    ("leaf", "force", "kwargs"),
    [(None, False, {}), (7, False, {"leaf_message_id": 7}), (None, True, {"force": True})],
)
def test_compress_later_sends_json_to_the_compress_queue(
    private_redis: RedisServer, leaf: int | None, force: bool, kwargs: dict[str, Any]
) -> None:
    """The message lands on `compress` (nothing on `celery`), JSON, with the task's name and
    arguments; the returned id is the message's task id."""
    task_id = compress_later("conv-1", leaf, force, broker_url=private_redis.url)
    (message,) = _queued(private_redis.url, COMPRESS_QUEUE)
    assert _queued(private_redis.url, DEFAULT_QUEUE) == []
    assert message["content-type"] == "application/json"
    assert message["headers"]["task"] == "recap.compress_session"
    assert message["headers"]["id"] == task_id
    args, sent_kwargs, _ = json.loads(base64.b64decode(message["body"]))
    assert (args, sent_kwargs) == (["conv-1"], kwargs)


def test_compress_later_reuses_one_app_per_broker(private_redis: RedisServer) -> None:
    """The sending app (and its producer pool) is made once per broker URL."""
    first = enqueue.producer_app(private_redis.url)
    compress_later("a", broker_url=private_redis.url)
    compress_later("b", broker_url=private_redis.url)
    assert enqueue.producer_app(private_redis.url) is first
    assert len(_queued(private_redis.url, COMPRESS_QUEUE)) == 2


@pytest.fixture(params=["redis", "rabbitmq"])
def broker_url(request: pytest.FixtureRequest) -> str:
    """A broker of the test's own: a private Redis server, or a fresh RabbitMQ vhost."""
    if request.param == "redis":
        return request.getfixturevalue("private_redis").url  # type: ignore[no-any-return]
    return str(request.getfixturevalue("amqp_url"))


def test_a_plain_send_task_by_name_is_served_by_recap_worker(
    broker_url: str, tmp_path: Path
) -> None:
    """`Celery(broker=URL).send_task("recap.compress_session", args=[id])`, the plainest call
    there is, and `compress_later`, are both consumed by a real `recap worker` process, on Redis
    and on RabbitMQ."""
    url = f"sqlite:///{tmp_path / 'recap.db'}"
    env = worker_env(
        RECAP_DATABASE_URL=url,
        RECAP_BROKER_URL=broker_url,
        RECAP_OUTPUT_DIR=str(tmp_path / "outputs"),
    )
    engine = make_engine(url)
    worker = WorkerProcess(env, tmp_path / "worker.log").launch()  # starts while we import
    try:
        upgrade(engine)
        ids = [f"plain-{uuid.uuid4().hex[:6]}", f"helper-{uuid.uuid4().hex[:6]}"]
        service.import_conversations(
            engine,
            [{"id": cid, "messages": chat(12, cid)} for cid in ids],
            get_settings(),
            max_input_tokens=WINDOW,
        )
        worker.wait_ready(1)
        plain = Celery(broker=broker_url)
        plain.send_task("recap.compress_session", args=[ids[0]])
        plain.close()
        compress_later(ids[1], broker_url=broker_url)
        for cid in ids:
            wait_for(
                lambda cid=cid: service.list_summaries(engine, cid),
                SERVED_TIMEOUT,
                f"a summary of {cid}",
                worker.log,
            )
    finally:
        worker.stop()
        enqueue.reset()
        engine.dispose()
