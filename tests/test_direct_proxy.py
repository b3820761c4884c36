"""serve's direct upstream client: its proxy from the environment, as httpx takes it (read once,
``NO_PROXY`` leaving hosts out), and a streamed reply read whole whatever its line endings and
the pieces it arrives in."""

from __future__ import annotations

import pytest

from recap.workers.serve.direct import env_proxy

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


# --- the direct client's stream reading, against a raw HTTP server ---------------------------

CHUNK = (
    '{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"%s"}}]}'
)

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
@pytest.mark.parametrize("piece", [1, 3, 4096])
def test_streamed_lines_are_read_whatever_their_ending(ending: bytes, piece: int) -> None:
    """Server-sent events end lines with LF, CRLF or CR; the pieces a stream arrives in may cut
    anywhere (between a CR and its LF too). Every chunk is read whole, a long one included."""
    import asyncio

    from recap.workers.serve.direct import DirectClient

    long = 70_000 if piece > 1 else 300  # 70 KB: longer than a line aiohttp's readline takes
    texts = ["hello", "x" * long, "bye"]
    events = [b"data: " + (CHUNK % text).encode() + ending + ending for text in texts]
    body = b"".join(events) + b"data: [DONE]" + ending + ending

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(HEAD)
        for start in range(0, len(body), piece):
            writer.write(body[start : start + piece])
            await writer.drain()
        writer.close()

    async def run() -> list[str]:
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = DirectClient(f"http://127.0.0.1:{port}/v1", None, 10.0)
        try:
            stream = await client.stream("openai/m", [], {})
            return [chunk.data["choices"][0]["delta"]["content"] async for chunk in stream]
        finally:
            await client.aclose()
            server.close()

    assert asyncio.run(run()) == texts
