"""A `recap serve` process for tests and benchmarks: started on a free port with the given
environment (``serve_env`` builds the usual one), ready when its health check answers, stopped by
its process group."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.processes import free_port, stop_group, wait_for

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 120.0  # seconds for a serve process to answer its health check (imports litellm)


@dataclass(frozen=True)
class ServeProcess:
    port: int
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def serve_env(
    db_url: str,
    folder: Path,
    *,
    keys: str,
    upstream: str,
    upstream_key: str,
    window: int,
    **extra: str,
) -> dict[str, str]:
    """The environment of a `recap serve` under test: its database, client keys, upstream and
    window, its folders under ``folder``, 256 tokens kept for the reply, JSON logs; ``extra`` (more
    ``RECAP_*`` values) on top."""
    return {
        "RECAP_DATABASE_URL": db_url,
        "RECAP_SERVE_KEYS": keys,
        "RECAP_UPSTREAM_API_BASE": upstream,
        "RECAP_UPSTREAM_API_KEY": upstream_key,
        "RECAP_SERVE_MAX_INPUT_TOKENS": str(window),
        "RECAP_RESERVE_OUTPUT_TOKENS": "256",
        "RECAP_BROKER_FOLDER": str(folder / "broker"),
        "RECAP_OUTPUT_DIR": str(folder / "outputs"),
        "RECAP_LOG_JSON": "true",
        **extra,
    }


def _healthy(port: int, process: subprocess.Popen[bytes], log: Path) -> bool:
    if process.poll() is not None:
        raise AssertionError("recap serve exited:\n" + log.read_text(errors="replace")[-3000:])
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def serve_process(
    env: Mapping[str, str], folder: Path, timeout: float = START_TIMEOUT
) -> Iterator[ServeProcess]:
    """`recap serve --port N` with ``os.environ`` updated by ``env``, run in ``folder`` (its
    output in ``folder/serve-N.log``); stopped afterwards."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = folder / f"serve-{port}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "recap.workers.cli", "serve", "--port", str(port)],
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            cwd=folder,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: _healthy(port, process, log), timeout, "recap serve's health check", log)
        yield ServeProcess(port, log)
    finally:
        stop_group(process)
