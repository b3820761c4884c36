"""docker-compose.yml's metrics wiring, read as YAML (no docker needed): serve exports its
metrics, every worker has its metrics port, Prometheus (behind the ``metrics`` profile,
published on 127.0.0.1 by default) scrapes exactly those services on those ports, and Grafana
(behind the ``dashboards`` profile) shows the dashboard over that Prometheus."""

from __future__ import annotations

import json
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


def test_grafana_shows_the_dashboard_over_that_prometheus_read_only() -> None:
    """Grafana (behind the ``dashboards`` profile, on 127.0.0.1 by default) is provisioned with
    the compose file's Prometheus as its data source and docs/grafana-dashboard.json as its
    dashboard, both read-only, for anonymous viewers with no login form (nobody can sign in as
    its default admin)."""
    compose = load("docker-compose.yml")
    services = compose["services"]
    grafana = services["grafana"]
    assert grafana["profiles"] == ["dashboards"]
    assert grafana["ports"] == ["${GRAFANA_BIND:-127.0.0.1}:3000:3000"]
    env = grafana["environment"]
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert env["GF_AUTH_DISABLE_LOGIN_FORM"] == "true"
    assert env["GF_USERS_ALLOW_SIGN_UP"] == "false"
    mounts = dict(
        v.rsplit(":", 1)[0].split(":", 1) for v in grafana["volumes"] if v.endswith(":ro")
    )
    provisioning = ROOT / "docs/grafana/provisioning"
    assert mounts["./docs/grafana/provisioning"] == "/etc/grafana/provisioning"
    (source,) = load(str(provisioning.relative_to(ROOT) / "datasources/prometheus.yml"))[
        "datasources"
    ]
    prometheus_port = services["prometheus"]["ports"][0].rsplit(":", 1)[1]
    assert source["type"] == "prometheus" and source["editable"] is False
    assert source["url"] == f"http://prometheus:{prometheus_port}"
    (provider,) = load(str(provisioning.relative_to(ROOT) / "dashboards/recap.yml"))["providers"]
    dashboard_mount = mounts["./docs/grafana-dashboard.json"]
    assert dashboard_mount.startswith(provider["options"]["path"] + "/")
    assert provider["allowUiUpdates"] is False
    dashboard = json.loads((ROOT / "docs/grafana-dashboard.json").read_text())
    assert {"prometheus"} == {
        p["datasource"]["type"] for p in dashboard["panels"] if "datasource" in p
    }
    assert "grafanadata" in compose["volumes"]
