"""docker-compose.yml validates and wires every service with the contract's setting names."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from core.settings import Settings
from tests.conftest import need_service

ROOT = Path(__file__).resolve().parent.parent
SERVICES = {
    "redis",
    "postgres",
    "migrate",
    "compress-worker",
    "maintenance-worker",
    "beat",
    "flower",
}


def compose_config() -> dict:  # type: ignore[type-arg]
    """The resolved configuration as docker-compose prints it."""
    if shutil.which("docker-compose"):
        command = ["docker-compose", "config"]
    elif (
        shutil.which("docker")
        and subprocess.run(
            ["docker", "compose", "version"], capture_output=True, check=False
        ).returncode
        == 0
    ):
        command = ["docker", "compose", "config"]
    else:
        need_service("docker-compose", "neither docker-compose nor `docker compose` is installed")
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def test_compose_file_is_valid_and_complete() -> None:
    """Every service is there; Recap's services use only settings the contract names."""
    config = compose_config()
    assert set(config["services"]) >= SERVICES
    known = {f"RECAP_{name.upper()}" for name in Settings.model_fields}
    for name in SERVICES - {"redis", "postgres"}:
        env = config["services"][name]["environment"]
        names = set(env) if isinstance(env, dict) else {e.split("=", 1)[0] for e in env}
        recap_names = {n for n in names if n.startswith("RECAP_")}
        assert recap_names <= known, recap_names - known
        assert {"RECAP_DATABASE_URL", "RECAP_BROKER_URL"} <= recap_names
        assert env["RECAP_BROKER_URL"].startswith("redis://")
        assert env["RECAP_DATABASE_URL"].startswith("postgresql")


def test_flower_has_auth_and_the_app() -> None:
    """Flower loads the Celery app (so tasks can be re-run) behind basic auth."""
    command = " ".join(compose_config()["services"]["flower"]["command"])
    assert "-A workers.app" in command and "flower" in command
    assert "--basic-auth=" in command


@pytest.mark.parametrize(
    ("service", "queue"), [("compress-worker", "compress"), ("maintenance-worker", "maintenance")]
)
def test_workers_serve_their_queue(service: str, queue: str) -> None:
    """Each worker service serves one queue, so each scales on its own."""
    command = compose_config()["services"][service]["command"]
    assert command[:2] == ["recap", "worker"] and queue in command
