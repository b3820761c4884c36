"""serve's direct upstream client takes its proxy from the environment, as httpx does: read
once, ``NO_PROXY`` leaving hosts out."""

from __future__ import annotations

import pytest

from workers.serve.direct import env_proxy

PROXY = "http://user:secret@proxy.example:3128"


@pytest.mark.parametrize(
    ("env", "url", "expected"),
    [
        ({}, "https://api.openai.com/v1/chat/completions", None),
        ({"HTTPS_PROXY": PROXY}, "https://api.openai.com/v1/chat/completions", PROXY),
        ({"https_proxy": PROXY}, "https://api.openai.com/v1/chat/completions", PROXY),
        ({"HTTPS_PROXY": PROXY}, "http://api.example/v1/chat/completions", None),
        ({"HTTP_PROXY": PROXY}, "http://api.example/v1/chat/completions", PROXY),
        ({"HTTPS_PROXY": PROXY, "NO_PROXY": "api.openai.com"}, "https://api.openai.com/v1", None),
        ({"HTTPS_PROXY": PROXY, "NO_PROXY": ".openai.com"}, "https://api.openai.com/v1", None),
        ({"HTTPS_PROXY": PROXY, "NO_PROXY": "other.example"}, "https://api.openai.com/v1", PROXY),
        ({"HTTPS_PROXY": PROXY, "NO_PROXY": "*"}, "https://api.openai.com/v1", None),
    ],
)
def test_the_proxy_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], url: str, expected: str | None
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert env_proxy(url) == expected
