"""docker-compose.yml's metrics wiring, read as YAML (no docker needed): serve exports its
metrics, every worker has its metrics port, and Prometheus (behind the ``metrics`` profile,
published on 127.0.0.1 by default) scrapes exactly those services on those ports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / name).read_text())
    return data


def test_prometheus_scrapes_serve_and_every_worker() -> None:
    compose = load("docker-compose.yml")
    services = compose["services"]
    prometheus = services["prometheus"]
    assert prometheus["profiles"] == ["metrics"]
    assert prometheus["ports"] == ["${PROMETHEUS_BIND:-127.0.0.1}:9090:9090"]
    mount = next(v for v in prometheus["volumes"] if v.endswith("/prometheus.yml:ro"))
    config = load(mount.split(":", 1)[0].removeprefix("./"))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["recap-serve"]["static_configs"] == [{"targets": ["serve:8400"]}]
    assert "8400:8400" in services["serve"]["ports"][0]
    assert services["serve"]["environment"]["RECAP_SERVE_METRICS"] == "${RECAP_SERVE_METRICS:-true}"
    (workers,) = jobs["recap-workers"]["dns_sd_configs"]
    assert set(workers["names"]) == {"compress-worker", "maintenance-worker"}
    for name in workers["names"]:
        env = services[name]["environment"]
        port = env["RECAP_WORKER_METRICS_PORT"]
        assert int(port) == workers["port"]
        assert "ports" not in services[name]  # scraped inside the network, never published
    assert "promdata" in compose["volumes"]
