"""The LiteLLM proxy (the OpenAI-compatible gateway Python teams run) beside `recap serve`, for
the serve benchmarks' side-by-side figures: the same stand-in model server behind both, timed
in the same rounds.

The proxy is no dependency of Recap, and the litellm Recap installs cannot run it: from 1.110 on,
litellm's ``[proxy]`` extra pulls the proxy from a package of its own (``litellm-proxy``) that
the package registry here does not serve. ``PROXY_VERSION`` is the newest litellm whose
``[proxy]`` extra installs from it whole. It goes into a virtual environment of its own, made
on first use under the user's cache folder (``$XDG_CACHE_HOME/recap-bench``, else
``~/.cache/recap-bench``) and reused after; nothing of it is committed or shipped. When it
cannot be installed or started, the figures that need it are left out and the reason goes to
stderr.

``python -m bench.litellm_proxy`` makes the environment and prints where it is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

PROXY_VERSION = "1.108.7"  # litellm 1.109.x needs a litellm-proxy-extras the registry lacks
INSTALL_TIMEOUT = 1800.0  # seconds for the first install (over a hundred packages)
START_TIMEOUT = 180.0  # seconds for the proxy to answer its liveliness check
UPSTREAM_KEY = "bench-upstream-key"
# The proxy's own key, which its clients send (it refuses to start without one, as it should)
PROXY_KEY = "sk-" + "5e7c" * 16


def cache_folder() -> Path:
    """Where the proxy's environment lives: outside the checkout, kept between runs."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "recap-bench"


def environment() -> Path:
    return cache_folder() / f"litellm-proxy-{PROXY_VERSION}"


def _ready(python: Path) -> bool:
    if not python.exists():
        return False
    check = [str(python), "-c", "import litellm.proxy.proxy_server"]
    done = subprocess.run(check, capture_output=True, env=_env(), check=False, timeout=300)
    return done.returncode == 0


def proxy_executable() -> tuple[Path | None, str]:
    """The proxy's ``litellm`` command, installing it first when needed; or None and why not."""
    folder = environment()
    python, command = folder / "bin" / "python", folder / "bin" / "litellm"
    if _ready(python) and command.exists():
        return command, ""
    print(f"bench: installing litellm[proxy]=={PROXY_VERSION} into {folder}", file=sys.stderr)
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(folder)],
        [str(python), "-m", "pip", "install", "-q", f"litellm[proxy]=={PROXY_VERSION}"],
    ]
    for step in steps:
        try:
            done = subprocess.run(
                step, capture_output=True, text=True, check=False, timeout=INSTALL_TIMEOUT
            )
        except subprocess.TimeoutExpired:
            return None, f"installing litellm[proxy]=={PROXY_VERSION} took over the time allowed"
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
            reason = (lines or done.stderr.strip().splitlines() or ["no reason given"])[-1]
            return None, f"litellm[proxy]=={PROXY_VERSION} did not install: {reason}"
    if not _ready(python) or not command.exists():
        return None, f"litellm[proxy]=={PROXY_VERSION} installed but its proxy does not import"
    return command, ""


def _env() -> dict[str, str]:
    """The proxy's environment: no remote price map, no database, no telemetry."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PYTHONPATH")}
    env.update(
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        LITELLM_LOG="ERROR",
        LITELLM_TELEMETRY="False",
        DISABLE_ADMIN_UI="True",
    )
    return env


@contextmanager
def litellm_proxy(model: str, upstream: str, folder: Path) -> Iterator[str | None]:
    """The LiteLLM proxy forwarding ``model`` to the model server at ``upstream`` (its base
    URL, ``.../v1``), or None (with the reason on stderr) when it cannot run here. Its clients
    send ``PROXY_KEY``."""
    from tests.support.processes import WaitTimeout, free_port, stop_group, wait_for

    command, reason = proxy_executable()
    if command is None:
        print(f"bench: the LiteLLM proxy cannot run here ({reason})", file=sys.stderr)
        yield None
        return
    config = folder / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {model}\n"
        "    litellm_params:\n"
        f"      model: {model}\n"
        f"      api_base: {upstream}\n"
        f"      api_key: {UPSTREAM_KEY}\n"
        "general_settings:\n"
        f"  master_key: {PROXY_KEY}\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
    )
    port = free_port()
    log = (folder / "litellm-proxy.log").open("wb")
    process = subprocess.Popen(
        [str(command), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=_env(),
        cwd=folder,
        start_new_session=True,
    )

    def healthy() -> bool:
        if process.poll() is not None:
            raise RuntimeError("the LiteLLM proxy exited; see litellm-proxy.log")
        try:
            url = f"http://127.0.0.1:{port}/health/liveliness"
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        try:
            wait_for(healthy, START_TIMEOUT, "the LiteLLM proxy")
        except (RuntimeError, WaitTimeout) as exc:
            tail = (folder / "litellm-proxy.log").read_text(errors="replace").strip()
            last = (tail.splitlines() or [str(exc)])[-1]
            print(f"bench: the LiteLLM proxy did not start ({last})", file=sys.stderr)
            yield None
            return
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        stop_group(process)
        log.close()


def main() -> int:
    command, reason = proxy_executable()
    if command is None:
        print(f"bench.litellm_proxy: {reason}", file=sys.stderr)
        return 1
    print(command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
