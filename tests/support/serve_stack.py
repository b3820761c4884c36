"""A `recap serve` process for tests and benchmarks: started on a free port with the given
environment, ready when its health check answers, stopped by its process group."""

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
            [sys.executable, "-m", "workers.cli", "serve", "--port", str(port)],
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
