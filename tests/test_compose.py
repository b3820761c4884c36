"""docker-compose.yml validates, wires every service with the contract's setting names, and is
safe by default: no default passwords, Flower on 127.0.0.1, Redis with a password and an
append-only file, the model's API key only where the model is called. docker-compose.rabbitmq.yml
over it moves every Recap service to a RabbitMQ broker with a required password of its own."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from recap.core.settings import Settings
from tests.support.services import need_service

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


# The variables compose requires (no defaults), with test values.
REQUIRED = {
    "POSTGRES_PASSWORD": "pg-test-pass",
    "REDIS_PASSWORD": "redis-test-pass",
    "FLOWER_USER": "operator",
    "FLOWER_PASSWORD": "flower-test-pass",
}
API_KEY = "sk-compose-test-key"
MODEL_CALLERS = {"compress-worker", "serve"}  # the services that call the model (serve compresses
# itself when a request does not fit)


def compose_env(**values: str) -> dict[str, str]:
    """The environment without any variable the compose file reads, plus ``values``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RECAP_", "FLOWER_")) and k not in REQUIRED
    }
    return {**env, **values}


RABBITMQ_FILE = "docker-compose.rabbitmq.yml"
RABBITMQ_PASSWORD = "rabbit-test-pass"


def run_config(env: dict[str, str], *overrides: str) -> subprocess.CompletedProcess[str]:
    """``docker-compose config`` (or ``docker compose config``) with this environment, over
    ``docker-compose.yml`` and these override files."""
    files = [arg for name in ("docker-compose.yml", *overrides) for arg in ("-f", name)]
    if shutil.which("docker-compose"):
        command = ["docker-compose", *files, "config"]
    elif (
        shutil.which("docker")
        and subprocess.run(
            ["docker", "compose", "version"], capture_output=True, check=False
        ).returncode
        == 0
    ):
        command = ["docker", "compose", *files, "config"]
    else:
        need_service("docker-compose", "neither docker-compose nor `docker compose` is installed")
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def compose_config(*overrides: str, **values: str) -> dict:  # type: ignore[type-arg]
    """The resolved configuration as docker-compose prints it, with the required variables set."""
    done = run_config(compose_env(**REQUIRED, RECAP_SUMMARY_API_KEY=API_KEY, **values), *overrides)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def environment(service: dict) -> dict[str, str]:  # type: ignore[type-arg]
    env = service.get("environment") or {}
    if isinstance(env, dict):
        return {k: str(v) for k, v in env.items()}
    return dict(item.split("=", 1) for item in env)


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


@pytest.mark.parametrize("missing", sorted(REQUIRED))
def test_a_missing_password_stops_compose_with_a_message(missing: str) -> None:
    """Every password is required: without one, compose fails and names the variable."""
    values = {k: v for k, v in REQUIRED.items() if k != missing}
    done = run_config(compose_env(**values))
    assert done.returncode != 0
    assert f"set {missing}" in done.stderr + done.stdout


def test_no_password_has_a_default_in_the_file() -> None:
    """No `${..PASSWORD:-default}` or `${FLOWER_USER:-...}` anywhere in the file."""
    text = (ROOT / "docker-compose.yml").read_text()
    for name in REQUIRED:
        assert f"${{{name}:-" not in text and f"${{{name}-" not in text, name


def test_flower_is_published_on_localhost_only_by_default() -> None:
    """The host side of Flower's port is 127.0.0.1 unless FLOWER_BIND says otherwise."""
    (port,) = compose_config()["services"]["flower"]["ports"]
    published = port if isinstance(port, str) else f"{port.get('host_ip')}:{port['published']}"
    assert published.startswith("127.0.0.1:")


def test_redis_has_a_password_and_an_append_only_file() -> None:
    """Redis requires the password the Recap services use and persists queued tasks."""
    config = compose_config()
    command = config["services"]["redis"]["command"]
    assert command[command.index("--requirepass") + 1] == REQUIRED["REDIS_PASSWORD"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert any(":/data" in str(v) for v in config["services"]["redis"].get("volumes", []))
    for name in SERVICES - {"redis", "postgres"}:
        broker = environment(config["services"][name])["RECAP_BROKER_URL"]
        assert broker.startswith(f"redis://:{REQUIRED['REDIS_PASSWORD']}@redis:")


def test_the_api_key_reaches_only_the_services_that_call_the_model() -> None:
    """RECAP_SUMMARY_API_KEY is set on the compress worker and nowhere else."""
    services = compose_config()["services"]
    holders = {name for name, s in services.items() if API_KEY in str(environment(s))}
    assert holders == MODEL_CALLERS


def rabbitmq_config() -> dict:  # type: ignore[type-arg]
    return compose_config(RABBITMQ_FILE, RABBITMQ_PASSWORD=RABBITMQ_PASSWORD)


def test_the_rabbitmq_file_moves_every_recap_service_to_rabbitmq() -> None:
    """Over the main file, every Recap service uses the RabbitMQ service with its password (and
    waits for it to be healthy), results stay in Redis, and nothing else of the service changes."""
    services = rabbitmq_config()["services"]
    url = f"amqp://recap:{RABBITMQ_PASSWORD}@rabbitmq:5672/recap"
    for name in SERVICES - {"redis", "postgres"}:
        env = environment(services[name])
        assert env["RECAP_BROKER_URL"] == url, name
        assert env["RECAP_RESULT_BACKEND"].startswith("redis://")
        assert env["RECAP_DATABASE_URL"].startswith("postgresql")
        if name != "migrate":
            assert services[name]["depends_on"]["rabbitmq"]["condition"] == "service_healthy"
    assert environment(services["compress-worker"])["RECAP_SUMMARY_API_KEY"] == API_KEY


def test_rabbitmq_has_a_password_a_volume_and_a_stable_node_name() -> None:
    """RabbitMQ's user has the password the services use, its data is on a volume, and the
    hostname (its node name, under which it keeps its data) is fixed."""
    rabbitmq = rabbitmq_config()["services"]["rabbitmq"]
    assert environment(rabbitmq)["RABBITMQ_DEFAULT_PASS"] == RABBITMQ_PASSWORD
    assert any(":/var/lib/rabbitmq" in str(v) for v in rabbitmq["volumes"])
    assert rabbitmq["hostname"] == "rabbitmq"
    assert "ports" not in rabbitmq  # reachable by the services, not published on the host


def test_rabbitmq_needs_its_password_and_only_when_chosen() -> None:
    """Without RABBITMQ_PASSWORD the RabbitMQ file stops compose with a message; the main file
    alone never asks for it."""
    done = run_config(compose_env(**REQUIRED), RABBITMQ_FILE)
    assert done.returncode != 0
    assert "set RABBITMQ_PASSWORD" in done.stderr + done.stdout
    assert run_config(compose_env(**REQUIRED)).returncode == 0
    text = (ROOT / RABBITMQ_FILE).read_text()
    assert "${RABBITMQ_PASSWORD:-" not in text and "${RABBITMQ_PASSWORD-" not in text
