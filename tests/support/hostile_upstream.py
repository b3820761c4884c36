"""A stand-in OpenAI-compatible upstream that misbehaves on cue, on 127.0.0.1, in a thread.

Where ``tests.support.llm_server`` plays a well-behaved model, this one answers each request with
the next scripted ``Answer``: bytes written exactly as given, as one body or as HTTP/1.1 chunks, and
optionally a connection closed before the body ends. The helpers build the usual misbehaviours:
plain JSON to a streamed request (``json_answer``), a stream whose chunks are given one by one
(``stream_answer``, with or without a ``finish_reason`` and ``[DONE]``), a stream cut off mid-way.
Unscripted requests get a well-formed reply (JSON, or a stream when asked for one) whose text
names the last user message.

``random_reply`` and ``relay_mismatches`` are the seeded check of the stream reader every API's
relay shares: random streamed replies around known secrets, and where what the relay lets out
differs from masking each text whole (the suite runs a few hundred, ``bench.serve_hostile``
20,000).
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

JSON_TYPE = "application/json"
EVENT_STREAM = "text/event-stream"


@dataclass(frozen=True)
class Answer:
    """One scripted answer: a status, a content type and the body's pieces (one piece: a body
    with its length; several: HTTP/1.1 chunks), and whether the connection is cut before the
    body ends (``cut``: the terminating chunk, or the last bytes, are never written)."""

    pieces: tuple[bytes, ...]
    status: int = 200
    content_type: str = JSON_TYPE
    cut: bool = False


def json_answer(payload: Any, status: int = 200) -> Answer:
    """A whole JSON body, whatever the request asked for."""
    return Answer((json.dumps(payload).encode(),), status=status)


def sse(payload: Any) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def stream_answer(chunks: list[dict[str, Any]], *, done: bool = True, cut: bool = False) -> Answer:
    """A stream of these chunk objects, then ``[DONE]`` when ``done``; cut off (no terminating
    chunk, the connection closed) when ``cut``."""
    pieces = [sse(chunk) for chunk in chunks]
    if done:
        pieces.append(b"data: [DONE]\n\n")
    return Answer(tuple(pieces), content_type=EVENT_STREAM, cut=cut)


def completion(
    text: str | None, *, usage: Any = None, finish: str | None = "stop", **message: Any
) -> dict[str, Any]:
    """A chat.completion object; ``message`` adds or replaces fields of the message."""
    body: dict[str, Any] = {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "stand-in",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, **message},
                "finish_reason": finish,
            }
        ],
    }
    body["usage"] = (
        usage
        if usage is not None
        else {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}
    )
    return body


def chunk(
    delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A chat.completion.chunk object of choice 0 (``choices=[]`` and ``usage=...`` in
    ``extra`` make a usage chunk)."""
    body: dict[str, Any] = {
        "id": "chatcmpl-stream",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "stand-in",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }
    body.update(extra)
    return body


def text_chunks(pieces: list[str], *, finish: str | None = "stop") -> list[dict[str, Any]]:
    """The chunks of a streamed text reply in these pieces, the finish (when given) and usage."""
    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": piece}) for piece in pieces]
    if finish is not None:
        chunks.append(chunk({}, finish))
    usage = {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}
    chunks.append(chunk(choices=[], usage=usage))
    return chunks


# --- random streamed replies, for the relay's masking (the suite's seeded cases and the bench) -


@dataclass(frozen=True)
class RandomReply:
    """A streamed reply: its chunks, each text whole (``reasoning_content``, ``content``,
    ``call0``, ``call1``) and how many tool calls it makes."""

    chunks: list[dict[str, Any]]
    texts: dict[str, str]
    calls: int


TEXTS = ("reasoning_content", "content", "call0", "call1")


def _split(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(0, 8))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def random_reply(rng: random.Random, secrets: list[str]) -> RandomReply:
    """Reasoning, then text, then up to two tool calls, each text made of the secrets, pieces
    of URLs and other words and split at random, with empty chunks between some pieces."""
    words = [*secrets, "sk-", "postgres://", "u:p@h", "db-", "Note:", "x", " ", "//", "@", "{"]
    texts = {f: "".join(rng.choice(words) for _ in range(rng.randint(1, 10))) for f in TEXTS}
    calls = rng.randint(0, 2)
    chunks = [chunk({"role": "assistant"})]
    for name in ("reasoning_content", "content"):
        for piece in _split(texts[name], rng):
            chunks.append(chunk({name: piece}))
            if rng.random() < 0.2:
                chunks.append(chunk({}))  # a keep-alive chunk between pieces
    for number in range(calls):
        head = {"index": number, "id": f"call_{number}", "function": {"name": "f"}}
        chunks.append(chunk({"tool_calls": [head]}))
        for piece in _split(texts[f"call{number}"], rng):
            chunks.append(
                chunk({"tool_calls": [{"index": number, "function": {"arguments": piece}}]})
            )
    chunks += [chunk({}, "tool_calls" if calls else "stop"), chunk(choices=[], usage={})]
    return RandomReply(chunks, texts, calls)


def relay_mismatches(reply: RandomReply, secrets: list[str]) -> list[str]:
    """Where the relay every API shares (``workers.serve.streaming.Relay.checked``) differs
    from masking each text whole: in the stored reply, in the Responses events and in the
    Messages events made of the chunks it lets out (their items in the upstream's order)."""
    from recap.core.redact import mask_known
    from recap.workers.serve import messages_api, response_events, responses_api
    from recap.workers.serve.direct import Chunk
    from recap.workers.serve.streaming import Relay

    async def stream() -> Any:
        for data in reply.chunks:
            yield Chunk(json.dumps(data).encode(), json.loads(json.dumps(data)))

    async def read(relay: Relay) -> list[dict[str, Any]]:
        return [json.loads(json.dumps(data)) async for _raw, data in relay.checked()]

    relay = Relay(stream(), include_usage=True, secrets=secrets)
    out = asyncio.run(read(relay))
    want = {name: mask_known(text, secrets) for name, text in reply.texts.items()}
    arguments = [want[f"call{n}"] for n in range(reply.calls)]
    problems = []
    assert relay.reply is not None
    message = relay.reply["choices"][0]["message"]
    calls = [c["function"]["arguments"] for c in message.get("tool_calls", [])]
    if (message["reasoning_content"], message["content"], calls) != (
        want["reasoning_content"],
        want["content"],
        arguments,
    ):
        problems.append(f"stored reply {message}")
    events = response_events.ResponseEvents(responses_api.Head(id="resp_x", model="m", echo={}))
    items = ([e for c in out for e in events.feed(c)] + events.finish())[-1]["response"]["output"]
    said = [
        (i["type"], i["content"][0]["text"] if i["type"] != "function_call" else i["arguments"])
        for i in items
    ]
    expected = [("reasoning", want["reasoning_content"]), ("message", want["content"])]
    if said != expected + [("function_call", a) for a in arguments]:
        problems.append(f"responses items {said}")
    blocks: dict[int, str] = {}
    anthropic = messages_api.MessageEvents(message_id="msg_x", model="m")
    for data in out:
        for event in anthropic.feed(data):
            if event["type"] == "content_block_delta":
                delta = event["delta"]
                piece = delta.get("thinking") or delta.get("text") or delta["partial_json"]
                blocks[event["index"]] = blocks.get(event["index"], "") + piece
    if list(blocks.values()) != [want["reasoning_content"], want["content"], *arguments]:
        problems.append(f"messages blocks {blocks}")
    return problems


def reply_text(body: dict[str, Any]) -> str:
    """The unscripted answer: it names the last user message."""
    users = [m for m in body.get("messages", []) if isinstance(m, dict) and m.get("role") == "user"]
    last = users[-1].get("content") if users else ""
    return f"reply to: {str(last)[:60]}"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


@dataclass
class HostileUpstream:
    """The server and its script; ``url`` is the base URL (``.../v1``)."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    _script: deque[Answer] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> HostileUpstream:
        self._server = _Server(("127.0.0.1", 0), _handler(self))
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def script(self, *answers: Answer) -> None:
        with self._lock:
            self._script.extend(answers)

    def clear(self) -> None:
        """Forget the answers not used yet (a test that failed before using its own)."""
        with self._lock:
            self._script.clear()

    def next_answer(self, body: dict[str, Any]) -> Answer:
        with self._lock:
            self.requests.append(body)
            if self._script:
                return self._script.popleft()
        text = reply_text(body)
        if body.get("stream"):
            words = text.split(" ")
            return stream_answer(text_chunks([words[0], *(" " + w for w in words[1:])]))
        return json_answer(completion(text))


def _handler(server: HostileUpstream) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError:
                body = {}
            answer = server.next_answer(body if isinstance(body, dict) else {})
            try:
                self._write(answer)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _write(self, answer: Answer) -> None:
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            if len(answer.pieces) == 1 and not answer.cut:
                self.send_header("Content-Length", str(len(answer.pieces[0])))
                self.end_headers()
                self.wfile.write(answer.pieces[0])
                return
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for piece in answer.pieces:
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                self.wfile.flush()
            if answer.cut:
                self.close_connection = True
                return
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    return Handler
