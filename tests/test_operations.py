"""Operations end to end: task logs as an operator reads them. Flower finding and re-running a
failed task is in test_failures.py, which shares this module's stack and Flower helpers.

A real worker runs as a child process (``celery -A workers.app worker``) on a database of the
test run's Redis server that the test holds alone, over a real database, calling the local model
server through litellm; Flower runs as another child process.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from recap.core import service
from recap.core.settings import get_settings
from recap.core.storage.db import make_engine
from recap.core.storage.migrate import upgrade
from tests.support.llm_server import LLMServer
from tests.support.processes import free_port, wait_for
from tests.support.services import redis_database
from tests.support.worker_stack import CELERY, ROOT, WorkerProcess, worker_env

__all__ = ["free_port"]  # test_failures takes it from here
API_KEY = "sk-test-do-not-log-7f3a91"
DB_PASSWORD = "pg-pass-do-not-log-55e1"
WINDOW = 1_200  # small, so a dozen turns are over the trigger
FLOWER_AUTH = ("operator", "flower-pass-9c2d")
READY_TIMEOUT = 60.0
LOG_TIMEOUT = 30.0  # a line the worker writes after the task's result is stored
_wait = wait_for  # the name test_failures and test_secrets import


def chat(turns: int) -> list[dict[str, str]]:
    messages = []
    for n in range(turns):
        messages.append(
            {"role": "user", "content": f"Step {n}: please look at src/app_{n}.py " * 6}
        )
        messages.append(
            {"role": "assistant", "content": f"Checked src/app_{n}.py, it is fine. " * 6}
        )
    return messages


@dataclass
class Stack:
    env: dict[str, str]
    engine: Any
    server: LLMServer
    worker_log: Path
    redis_url: str

    def new_conversation(self) -> str:
        cid = f"ops-{uuid.uuid4().hex[:8]}"
        service.import_conversations(
            self.engine,
            [{"id": cid, "messages": chat(12)}],
            get_settings(),
            max_input_tokens=WINDOW,
        )
        return cid


@contextmanager
def stack(postgres_url: str, redis_url: str, tmp_path: Path, **extra: str) -> Iterator[Stack]:
    """A worker child process on a database of the Redis server that this test holds alone,
    PostgreSQL (its URL carrying a password that trust authentication ignores), and the local
    model server with an API key."""
    db_url = postgres_url.replace("postgres@", f"postgres:{DB_PASSWORD}@", 1)
    with redis_database(redis_url) as private:
        server = LLMServer().start()
        values = {
            "RECAP_DATABASE_URL": db_url,
            "RECAP_BROKER_URL": private,
            "RECAP_RESULT_BACKEND": private,
            "RECAP_SUMMARY_MODEL": "openai/stand-in",
            "RECAP_SUMMARY_API_BASE": server.url,
            "RECAP_SUMMARY_API_KEY": API_KEY,
            "RECAP_RETRY_BACKOFF_MAX": "1",
            "RECAP_OUTPUT_DIR": str(tmp_path / "outputs"),
        }
        env = worker_env(**{**values, **extra})  # a test's own values win
        os.environ.update({k: v for k, v in env.items() if k.startswith("RECAP_")})
        get_settings.cache_clear()
        args: tuple[str, ...] = ("--pool", "threads", "--concurrency", "2")
        args += ("--queues", "compress,maintenance")
        args += ("--loglevel", "INFO", "--hostname", f"ops-{uuid.uuid4().hex[:6]}@%h")
        worker = WorkerProcess(
            env,
            tmp_path / "worker.log",  # stderr: the log lines
            args=args,
            program=CELERY,
            stdout=tmp_path / "worker.out",  # Celery's own prints
        )
        engine = make_engine(db_url)
        try:
            worker.launch()  # it starts (seconds) while the schema is migrated
            upgrade(engine)
            worker.wait_ready(1, READY_TIMEOUT)
            yield Stack(env, engine, server, worker.log, private)
        finally:
            worker.stop()
            server.stop()
            engine.dispose()
            for key in [k for k in os.environ if k.startswith("RECAP_")]:
                os.environ.pop(key)
            get_settings.cache_clear()


def _enqueue(stack_: Stack, cid: str) -> dict[str, Any]:
    from celery import Celery

    client = Celery(broker=stack_.redis_url, backend=stack_.redis_url)
    client.conf.task_routes = {"recap.compress_session": {"queue": "compress"}}
    result = client.send_task("recap.compress_session", args=[cid])
    value = result.get(timeout=90)
    client.close()
    return dict(value)


@pytest.fixture
def services(postgres_url: str, redis_url: str) -> tuple[str, str]:
    return postgres_url, redis_url


def test_task_log_lines_are_json_with_context_and_no_secrets(
    services: tuple[str, str], tmp_path: Path
) -> None:
    """Every worker line is JSON; a task's lines (Celery's own included) carry task_id, task_name
    and conversation_id; neither the API key nor the URL password appears anywhere."""
    with stack(*services, tmp_path) as s:
        cid = s.new_conversation()
        outcome = _enqueue(s, cid)
        assert outcome["action"] == "summarized", outcome
        assert s.server.requests, "the model was called"
        assert s.server.requests[0].headers.get("authorization", "").endswith(API_KEY)
        wait_for(  # Celery logs the task's success after storing the result the test read
            lambda: any("succeeded" in str(line.get("event")) for line in _task_lines(s)),
            LOG_TIMEOUT,
            "the task's 'succeeded' line",
            s.worker_log,
        )
    text = s.worker_log.read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert lines, "the worker logged nothing"
    assert API_KEY not in text and DB_PASSWORD not in text
    task_lines = [line for line in lines if line.get("task_name") == "recap.compress_session"]
    assert len(task_lines) >= 3, task_lines  # received, events, canonical line, succeeded
    for line in task_lines:
        assert line.get("task_id") and line.get("conversation_id") == cid, line
    received = [line for line in task_lines if "received" in str(line.get("event"))]
    assert received, "Celery's own 'received' line carries the task context"
    done = [line for line in task_lines if line.get("event") == "task_done"]
    assert len(done) == 1 and done[0]["action"] == "summarized"
    assert "tokens_before" in done[0] and "duration_ms" in done[0]


def _task_lines(stack_: Stack) -> list[dict[str, Any]]:
    """The worker's JSON log lines about a compress_session task (a line still being written
    is left for the next look)."""
    found = []
    for line in stack_.worker_log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("task_name") == "recap.compress_session":
            found.append(entry)
    return found


def _flower(env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as sink:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "recap.workers.app",
                "flower",
                f"--port={port}",
                "--address=127.0.0.1",
                f"--basic-auth={FLOWER_AUTH[0]}:{FLOWER_AUTH[1]}",
            ],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _http(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    token = base64.b64encode(f"{FLOWER_AUTH[0]}:{FLOWER_AUTH[1]}".encode()).decode()
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"Basic {token}")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except OSError:
        return 0, None
