"""Token accounting with plain values: encodings, overheads, windows, calibration."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import tiktoken

from recap.core.counting import tokens
from recap.core.counting.tokens import CL100K, O200K

tokens.ensure_offline_encodings()  # the comparisons below call tiktoken itself: no download


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o-mini", O200K),
        ("openai/gpt-4o", O200K),
        ("gpt-4.1-nano", O200K),
        ("o3-mini", O200K),
        ("gpt-5", O200K),
        ("gpt-4", CL100K),
        ("gpt-3.5-turbo", CL100K),
        ("anthropic/claude-sonnet-4-5", CL100K),
        ("ollama/llama3", CL100K),
    ],
)
def test_encoding_by_family(model: str, encoding: str) -> None:
    """Current OpenAI models use o200k; everything else is counted with cl100k."""
    assert tokens.encoding_name_for(model) == encoding


@pytest.mark.parametrize("encoding", [O200K, CL100K])
@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello world",
        "def f(x):\n    return x * 2\n",
        "<|endoftext|> is text here",
        "héllo 世界",
    ],
)
def test_plain_text_matches_tiktoken(encoding: str, text: str) -> None:
    """Plain-string counts equal tiktoken's encode_ordinary."""
    expected = len(tiktoken.get_encoding(encoding).encode_ordinary(text))
    assert tokens.count_text(text, encoding) == expected


CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"c":"ls"}'}}


@pytest.mark.parametrize(
    ("message", "parts"),
    [
        ({"role": "user", "content": "hi"}, ["user", "hi"]),
        ({"role": "assistant", "content": None, "tool_calls": [CALL]}, ["assistant"]),
        (
            {"role": "tool", "content": "a.txt", "tool_call_id": "call_1", "name": "bash"},
            ["tool", "a.txt", "call_1", "bash"],
        ),
    ],
)
def test_message_overheads_are_additive(message: dict[str, object], parts: list[str]) -> None:
    """A message costs its texts plus fixed per-message, per-name and per-call overheads."""
    expected = tokens.TOKENS_PER_MESSAGE + sum(tokens.count_text(p, O200K) for p in parts)
    if message.get("name"):
        expected += tokens.TOKENS_PER_NAME
    for call in message.get("tool_calls") or []:  # type: ignore[attr-defined]
        expected += tokens.count_tool_call(call, O200K)
    assert tokens.count_message(message, O200K) == expected


def test_tool_calls_count_arguments() -> None:
    """Longer arguments cost more; the same call always costs the same."""
    short = tokens.count_tool_call(CALL, O200K)
    long_call = {**CALL, "function": {"name": "bash", "arguments": '{"c":"ls -la /tmp /var"}'}}
    assert tokens.count_tool_call(long_call, O200K) > short
    assert tokens.count_tool_call(dict(CALL), O200K) == short


def test_request_and_tools() -> None:
    """A request adds reply priming; tool schemas add their JSON plus a block overhead."""
    messages = [{"role": "user", "content": "hi"}]
    assert tokens.count_messages(
        messages, O200K
    ) == tokens.TOKENS_REPLY_PRIMING + tokens.count_message(messages[0], O200K)
    assert tokens.count_tools(None, O200K) == 0
    schema = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    assert tokens.count_tools(schema, O200K) > tokens.TOKENS_PER_TOOLS_BLOCK


@pytest.mark.parametrize(
    ("model", "override", "expected"),
    [
        ("gpt-4o-mini", None, 128_000),
        ("openai/gpt-4o-mini", None, 128_000),
        ("gpt-4o-mini", 16_000, 16_000),
        ("my-local-model", 8_192, 8_192),
    ],
)
def test_context_window(model: str, override: int | None, expected: int) -> None:
    """Windows come from litellm's bundled map, or the override."""
    assert tokens.context_window(model, override) == expected


@pytest.mark.parametrize(("model", "override"), [("my-local-model", None), ("gpt-4o", 0)])
def test_context_window_errors(model: str, override: int | None) -> None:
    """An unknown model without an override, or a non-positive override, is a clear error."""
    with pytest.raises(ValueError, match=r"unknown model|positive"):
        tokens.context_window(model, override)


@pytest.mark.parametrize(
    ("window", "margin", "fixed", "expected"),
    [(10_000, 0.05, 0, 9_500), (10_000, 0.05, 1_500, 8_000), (128_000, 0.0, 0, 128_000)],
)
def test_available_tokens(window: int, margin: float, fixed: int, expected: int) -> None:
    """available = window x (1 - margin) - fixed parts."""
    assert tokens.available_tokens(window, margin, fixed) == expected


@pytest.mark.parametrize(
    ("estimated", "measured", "factor"),
    [(1000, 1100, 1.1), (1000, 900, 0.9), (0, 50, 1.0), (100, 1000, 2.0), (1000, 10, 0.5)],
)
def test_calibration_factor(estimated: int, measured: int, factor: float) -> None:
    """measured / estimated, clamped to [0.5, 2]."""
    assert tokens.Calibration(estimated, measured).factor == pytest.approx(factor)


def test_counting_works_offline(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """With no tiktoken cache configured and every network request failing, counts still work."""
    env = {k: v for k, v in os.environ.items() if k != "TIKTOKEN_CACHE_DIR"}
    dead_proxy = "http://127.0.0.1:9"
    env.update(
        HTTP_PROXY=dead_proxy,
        HTTPS_PROXY=dead_proxy,
        http_proxy=dead_proxy,
        https_proxy=dead_proxy,
        NO_PROXY="",
        HOME=str(tmp_path),
    )
    code = (
        "from core.counting import tokens\n"
        "print(tokens.count_text('hello world', 'o200k_base'),"
        " tokens.count_text('hello world', 'cl100k_base'))\n"
        "import sys; assert 'litellm' not in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["2", "2"]
