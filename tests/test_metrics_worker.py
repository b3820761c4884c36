"""A worker with RECAP_WORKER_METRICS_PORT: its metrics page after real compressions on a real
worker process (a threads pool, Redis, PostgreSQL, the stand-in model over HTTP through litellm)
says each one's value: runs by action and outcome and their durations, the summarizer's calls
(one failed, then retried) and tokens, the retry, the tokens saved (what the runs' results say),
the failed run, and the queue lag of a compression sent long ago.
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from recap.workers.enqueue import CompressJob, send
from recap.workers.queues import ENQUEUED_HEADER
from tests.support.llm_server import Reply
from tests.support.processes import free_port, wait_for
from tests.test_operations import Stack, stack

pytestmark = pytest.mark.redis

OLD = 300.0  # seconds before now a compression claims it was sent


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def client(stack_: Stack) -> Celery:
    app = Celery(broker=stack_.redis_url, backend=stack_.redis_url)
    app.conf.task_routes = {"recap.compress_session": {"queue": "compress"}}
    return app


def compress(stack_: Stack, cid: str) -> Any:
    app = client(stack_)
    try:
        return send(app, CompressJob(cid)).get(timeout=90, propagate=False)
    finally:
        app.close()


def listening(port: int) -> bool:
    try:
        scrape(port)
    except OSError:
        return False
    return True


def test_worker_metrics_count_real_runs(postgres_url: str, redis_url: str, tmp_path: Path) -> None:
    port = free_port()
    extra = {"RECAP_WORKER_METRICS_PORT": str(port), "RECAP_MAX_ATTEMPTS": "3"}
    with stack(postgres_url, redis_url, tmp_path, **extra) as running:
        wait_for(lambda: listening(port), 30, "the worker's metrics port")
        start = scrape(port)
        done = running.new_conversation()
        first = compress(running, done)
        assert first["action"] == "summarized"
        calls_before = len(running.server.requests)
        running.server.script(Reply(status=503))  # the next summary call fails, then is retried
        second = compress(running, running.new_conversation())
        assert second["action"] == "summarized"
        calls = len(running.server.requests)
        again = compress(running, done)  # nothing left to do
        assert again["action"] == "skipped"
        running.server.script(Reply(status=400, error="bad request"))  # fatal: the run fails
        failed = compress(running, running.new_conversation())
        assert isinstance(failed, Exception)
        # a compression sent OLD seconds ago is taken now: the lag is its age
        app = client(running)
        sent = app.send_task(
            "recap.compress_session",
            args=[running.new_conversation()],
            queue="compress",
            headers={ENQUEUED_HEADER: time.time() - OLD},
        )
        last = sent.get(timeout=90)
        assert last["action"] == "summarized"
        app.close()
        end = scrape(port)

    def grew(name: str, **labels: str) -> float:
        return value(end, name, **labels) - value(start, name, **labels)

    assert grew("recap_worker_runs_total", action="summarized", outcome="completed") == 3
    assert grew("recap_worker_runs_total", action="skipped", outcome="completed") == 1
    assert grew("recap_worker_runs_total", action="failed", outcome="failed") == 1
    assert grew("recap_worker_failed_runs_total") == 1
    assert grew("recap_worker_run_duration_seconds_count", action="summarized") == 3
    assert 0 < grew("recap_worker_run_duration_seconds_sum", action="summarized") < 90
    assert grew("recap_worker_retries_total") == 1
    assert grew("recap_worker_summarizer_calls_total", outcome="error") == 2
    total_calls = len(running.server.requests)
    ok = grew("recap_worker_summarizer_calls_total", outcome="ok")
    assert ok + 2 == total_calls
    assert calls - calls_before >= 2  # the failed call and its retry
    assert grew("recap_worker_summarizer_tokens_total", direction="input") > 0
    assert grew("recap_worker_summarizer_tokens_total", direction="output") > 0
    saved = sum(run["tokens_before"] - run["tokens_after"] for run in (first, second, last))
    assert saved > 0
    assert grew("recap_worker_saved_tokens_total") == saved
    # five sends, one retry (a retry keeps its first sending's header)
    assert grew("recap_worker_queue_wait_seconds_count") >= 5
    assert OLD <= value(end, "recap_worker_queue_lag_seconds") < OLD + 60


def test_each_prefork_child_serves_its_own_metrics(redis_url: str, tmp_path: Path) -> None:
    """A prefork pool of two: each child listens on its own port after the base one (logged),
    and the runs they did add up across the two pages."""
    import json
    import os

    from recap.core import service
    from recap.core.settings import get_settings
    from recap.core.storage.db import make_engine
    from recap.core.storage.migrate import upgrade
    from tests.support.llm_server import LLMServer
    from tests.support.services import redis_database
    from tests.support.worker_stack import CELERY, WorkerProcess, worker_env
    from tests.test_operations import WINDOW, chat

    port = free_port()
    db_url = f"sqlite:///{tmp_path / 'recap.db'}"
    engine = make_engine(db_url)
    upgrade(engine)
    with redis_database(redis_url) as private:
        server = LLMServer().start()
        values = {
            "RECAP_DATABASE_URL": db_url,
            "RECAP_BROKER_URL": private,
            "RECAP_RESULT_BACKEND": private,
            "RECAP_SUMMARY_MODEL": "openai/stand-in",
            "RECAP_SUMMARY_API_BASE": server.url,
            "RECAP_SUMMARY_API_KEY": "sk-prefork-test-key",
            "RECAP_WORKER_METRICS_PORT": str(port),
            "RECAP_OUTPUT_DIR": str(tmp_path / "outputs"),
        }
        args = ("--pool", "prefork", "--concurrency", "2", "--queues", "compress", "-l", "INFO")
        worker = WorkerProcess(worker_env(**values), tmp_path / "worker.log", args, program=CELERY)
        saved = {k: os.environ.get(k) for k in values}
        os.environ.update(values)
        get_settings.cache_clear()
        try:
            worker.start()
            worker.wait_log("worker_metrics_listening", 60, count=2)
            ports = sorted(
                json.loads(line)["port"]
                for line in worker.text().splitlines()
                if "worker_metrics_listening" in line
            )
            assert len(ports) == 2 and all(port < p <= port + 64 for p in ports)
            assert not listening(port)  # the parent runs no task: it serves nothing
            cids = []
            for n in range(4):
                cid = f"prefork-{n}"
                service.import_conversations(
                    engine, [{"id": cid, "messages": chat(12)}], get_settings(),
                    max_input_tokens=WINDOW,
                )  # fmt: skip
                cids.append(cid)
            app = Celery(broker=private, backend=private)
            results = [send(app, CompressJob(cid)).get(timeout=90) for cid in cids]
            app.close()
            summarized = sum(r["action"] == "summarized" for r in results)
            assert summarized == len(cids)
            pages = [scrape(p) for p in ports]
            runs = sum(
                value(page, "recap_worker_runs_total", action="summarized", outcome="completed")
                for page in pages
            )
            assert runs == summarized
        finally:
            worker.stop()
            server.stop()
            engine.dispose()
            for key, old in saved.items():
                if old is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = old
            get_settings.cache_clear()
