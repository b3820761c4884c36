"""A small OpenAI-compatible ``/v1/chat/completions`` server on 127.0.0.1, in a thread (it also
answers ``/v1/responses``, the Responses API: a message or function calls, streamed or not, and
``/v1/responses/compact``).

Tests and benchmarks point litellm at it (``openai/<name>`` with ``api_base``) and script what it
answers: summaries, 429s, 500s, 401s, blank text, slow replies, or a reply held until released.
A request with ``"stream": true`` is answered as server-sent events (text in a few chunks, tool
call arguments in two, a ``usage`` chunk when ``stream_options.include_usage`` asks for it), and a
scripted reply can carry tool calls, reasoning, an error code, or a pause between chunks.
Every request is recorded with its JSON body and, when a probe is given, the probe's reading at
the moment the request arrived (the tests use it to count checked-out database connections).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_SUMMARY_WORDS = 120  # the stand-in summary is short, like a real one
MAX_QUOTED_IDENTIFIERS = 60  # the stand-in summary quotes at most this many identifiers


@dataclass
class Reply:
    """One scripted answer: a status, a text, a delay, or a hold until ``release()``."""

    text: str | None = None
    status: int = 200
    delay: float = 0.0
    hold: bool = False
    error: str = "scripted error"
    code: str | None = None  # the error's code, e.g. "context_length_exceeded"
    tool_calls: list[dict[str, Any]] | None = None
    reasoning: str | None = None
    chunk_delay: float = 0.0  # seconds between streamed chunks


@dataclass
class Recorded:
    """A request as the server saw it."""

    body: dict[str, Any]
    headers: dict[str, str]
    probe: Any
    at: float

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The chat messages, or a Responses request's input items."""
        return list(self.body.get("messages", self.body.get("input", [])))

    @property
    def text(self) -> str:
        """Every message's content, joined: what a test greps for."""
        return "\n".join(str(m.get("content") or "") for m in self.messages)


def stand_in_summary(body: dict[str, Any]) -> str:
    """A plausible summary of a summarizer request: the template, its goal taken from the first
    words, quoting the identifiers of the previous summary and of the messages before the cutoff
    marker (what a good model keeps), at most ``MAX_QUOTED_IDENTIFIERS`` of them."""
    from recap.core.summaries.identifiers import commands_in_text, identifiers_in_text

    messages = body.get("messages", [])
    before: list[str] = [str(messages[0].get("content") or "")] if messages else []
    for message in messages[1:]:
        content = str(message.get("content") or "")
        if content.startswith("=== CUTOFF"):
            break
        before.append(content)
    text = "\n".join(before)
    names = sorted(identifiers_in_text(text) | commands_in_text(text))
    words = " ".join(" ".join(before[1:]).split()[:DEFAULT_SUMMARY_WORDS])
    quoted = "\n".join(f"- `{n}`" for n in names[:MAX_QUOTED_IDENTIFIERS]) or "- (none)"
    return (
        "## Goal\n- " + (words[:400] or "(none)") + "\n## Constraints and preferences\n- (none)\n"
        "## Progress\n### Done\n- worked through the earlier steps\n### In progress\n- (none)\n"
        "### Blocked\n- (none)\n## Key decisions\n- (none)\n## Next steps\n- continue\n"
        "## Critical context\n" + quoted + "\n## Relevant files\n- (see above)"
    )


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # a burst of concurrent clients is queued, not refused


@dataclass
class LLMServer:
    """The server and its script. ``url`` is the ``api_base`` to give litellm."""

    default: Callable[[dict[str, Any]], str] = stand_in_summary
    default_delay: float = 0.0  # seconds every unscripted reply waits (a model's latency)
    probe: Callable[[], Any] | None = None
    # counts each chat request by its content and refuses one over its window (usage reports
    # its count and cached share): ``tests.support.content_meter.ContentMeter``
    meter: Any = None
    # answers a request by its body before the default (a window that refuses what is too long)
    refuse: Callable[[dict[str, Any]], Reply | None] | None = None
    requests: list[Recorded] = field(default_factory=list)
    # per streamed reply, the bytes of its body written before it ended, the whole body's, and
    # when it ended (``time.monotonic``): fewer written than the whole means the client closed
    # the connection first
    streamed: list[tuple[int, int, float]] = field(default_factory=list)
    _script: deque[Reply] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _released: threading.Event = field(default_factory=threading.Event)
    _arrived: threading.Condition = field(default_factory=threading.Condition)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> LLMServer:
        handler = _make_handler(self)
        self._server = _Server(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._released.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def script(self, *replies: Reply) -> None:
        """Answer the next requests with these replies, in order; then the default."""
        with self._lock:
            self._script.extend(replies)

    def clear_script(self) -> None:
        """Forget the scripted replies not used yet."""
        with self._lock:
            self._script.clear()

    def release(self) -> None:
        """Let every held reply go (and any later one with ``hold``)."""
        self._released.set()

    def hold_again(self) -> None:
        """After a ``release()``: the next replies scripted with ``hold`` are held again."""
        self._released.clear()

    def wait_for(self, count: int, timeout: float = 30.0) -> bool:
        """Block until at least ``count`` requests have arrived."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while len(self.requests) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._arrived.wait(left)
        return True

    def _next(self) -> Reply | None:
        with self._lock:
            return self._script.popleft() if self._script else None

    def _record(self, body: dict[str, Any], headers: dict[str, str]) -> None:
        reading = self.probe() if self.probe is not None else None
        with self._arrived:
            self.requests.append(Recorded(body, headers, reading, time.monotonic()))
            self._arrived.notify_all()


STREAM_WORDS_PER_CHUNK = 3  # a streamed reply arrives in several chunks, as from a real model


def _usage(text: str, body: dict[str, Any], read: tuple[int, int] | None = None) -> dict[str, Any]:
    prompt_chars = sum(len(str(m.get("content") or "")) for m in body.get("messages", []))
    prompt, cached = read if read is not None else (prompt_chars // 4, None)
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": len(text) // 4,
        "total_tokens": prompt + len(text) // 4,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def _completion(
    text: str,
    body: dict[str, Any],
    reply: Reply | None = None,
    read: tuple[int, int] | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reply is not None and reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
        message["content"] = text or None
    if reply is not None and reply.reasoning:
        message["reasoning_content"] = reply.reasoning
    return {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "stand-in"),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
            }
        ],
        "usage": _usage(text, body, read),
    }


def _response_object(text: str, body: dict[str, Any], reply: Reply | None) -> dict[str, Any]:
    """A Responses API answer (``POST /v1/responses``, not streamed): a message, or the scripted
    tool calls as ``function_call`` items."""
    stamp = time.monotonic_ns()
    output: list[dict[str, Any]] = []
    if reply is not None and reply.tool_calls:
        for call in reply.tool_calls:
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{stamp}_{call['id']}",
                    "call_id": call["id"],
                    "name": call["function"]["name"],
                    "arguments": call["function"].get("arguments", ""),
                    "status": "completed",
                }
            )
    else:
        content = [{"type": "output_text", "text": text, "annotations": []}]
        message = {"type": "message", "id": f"msg_{stamp}", "role": "assistant"}
        output.append({**message, "status": "completed", "content": content})
    prompt = len(json.dumps(body.get("input", ""))) // 4
    return {
        "id": f"resp_{stamp}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": body.get("model", "stand-in"),
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": prompt,
            "output_tokens": len(text) // 4,
            "total_tokens": prompt + len(text) // 4,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def _compacted(text: str, body: dict[str, Any]) -> dict[str, Any]:
    """A ``responses.compact`` answer as OpenAI documents it: every user message of the input,
    then one compaction item (whose "encrypted" content here is the reply text itself)."""
    stamp = time.monotonic_ns()
    output: list[dict[str, Any]] = []
    for n, item in enumerate(body.get("input") or ()):
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                content = [{"type": "input_text", "text": content}]
            message = {"type": "message", "id": f"msg_{stamp}_{n}", "role": "user"}
            output.append({**message, "status": "completed", "content": content})
    output.append({"type": "compaction", "id": f"cmp_{stamp}", "encrypted_content": text})
    prompt = len(json.dumps(body.get("input", ""))) // 4
    usage = {
        "input_tokens": prompt,
        "output_tokens": len(text) // 4,
        "total_tokens": prompt + len(text) // 4,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    return {
        "id": f"cmpresp_{stamp}",
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": output,
        "usage": usage,
    }


def _response_events(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """A streamed Responses answer: created, each text delta, completed (what clients read)."""
    started = {**answer, "status": "in_progress", "output": []}
    events: list[dict[str, Any]] = [{"type": "response.created", "response": started}]
    for index, item in enumerate(answer["output"]):
        for part in item.get("content") or ():
            delta = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events.append(
                {
                    "type": "response.output_text.delta",
                    **delta,
                    "delta": part["text"],
                    "logprobs": [],
                }
            )
    events.append({"type": "response.completed", "response": answer})
    return [{**event, "sequence_number": n} for n, event in enumerate(events)]


def _stream_deltas(text: str, reply: Reply) -> list[dict[str, Any]]:
    """The deltas of a streamed reply: the role, reasoning, text in pieces, each tool call with
    its arguments split in two."""
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if reply.reasoning:
        deltas.append({"reasoning_content": reply.reasoning})
    words = text.split(" ")
    for start in range(0, len(words), STREAM_WORDS_PER_CHUNK):
        piece = " ".join(words[start : start + STREAM_WORDS_PER_CHUNK])
        deltas.append({"content": piece if start == 0 else " " + piece})
    for index, call in enumerate(reply.tool_calls or ()):
        arguments = str(call["function"].get("arguments", ""))
        half = len(arguments) // 2
        head = {"index": index, "id": call["id"], "type": "function"}
        deltas.append(
            {
                "tool_calls": [
                    {
                        **head,
                        "function": {
                            "name": call["function"]["name"],
                            "arguments": arguments[:half],
                        },
                    }
                ]
            }
        )
        deltas.append(
            {"tool_calls": [{"index": index, "function": {"arguments": arguments[half:]}}]}
        )
    return deltas


def _stream_events(
    text: str, body: dict[str, Any], reply: Reply, read: tuple[int, int] | None = None
) -> list[dict[str, Any]]:
    """Every chunk object of a streamed reply, the usage chunk last when asked for."""
    base = {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": body.get("model", "stand-in"),
    }
    events = [
        {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        for delta in _stream_deltas(text, reply)
    ]
    finish = "tool_calls" if reply.tool_calls else "stop"
    events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append({**base, "choices": [], "usage": _usage(text, body, read)})
    return events


def _make_handler(server: LLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # headers and body go out as separate writes: without this, Nagle holds the body until
        # the client's delayed ACK (about 40 ms), a latency no real server adds
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def do_GET(self) -> None:
            """``GET /v1/models``: the one model this server stands in for."""
            if not self.path.rstrip("/").endswith("/models"):
                self._send(404, {"error": {"message": "not found", "type": "scripted"}})
                return
            self._send(200, {"object": "list", "data": [{"id": "stand-in", "object": "model"}]})

        def do_POST(self) -> None:
            arrived = time.monotonic()
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError:
                body = {}
            server._record(body, dict(self.headers.items()))
            read = None
            if server.meter is not None and self.path.rstrip("/").endswith("/chat/completions"):
                read = server.meter.read(body)
                if read[0] > server.meter.window:  # refused before a scripted reply is used
                    message = server.meter.refusal(read[0])
                    error = {"message": message, "type": "invalid_request_error"}
                    self._send(400, {"error": {**error, "code": "context_length_exceeded"}})
                    return
            refused = server.refuse(body) if server.refuse is not None else None
            reply = server._next() or refused or Reply(delay=server.default_delay)
            # the reply is written before the wait, so that the delay is the whole answer time
            # seen by the client, as with a real model (not the delay plus this server's work)
            text = reply.text if reply.text is not None else server.default(body)
            if reply.hold:
                server._released.wait()
            if reply.delay:
                time.sleep(max(0.0, arrived + reply.delay - time.monotonic()))
            if reply.status != 200:
                error = {"error": {"message": reply.error, "type": "scripted", "code": reply.code}}
                self._send(reply.status, error)
                return
            if self.path.rstrip("/").endswith("/responses/compact"):  # responses.compact
                self._send(200, _compacted(text, body))
                return
            if self.path.rstrip("/").endswith("/responses"):  # the Responses API
                answer = _response_object(text, body, reply)
                if body.get("stream"):
                    self._stream(_response_events(answer), reply.chunk_delay)
                else:
                    self._send(200, answer)
                return
            if body.get("stream"):
                self._stream(_stream_events(text, body, reply, read), reply.chunk_delay)
                return
            self._send(200, _completion(text, body, reply, read))

        def _stream(self, events: list[dict[str, Any]], delay: float) -> None:
            """Server-sent events in HTTP/1.1 chunks, one event per chunk, then ``[DONE]``."""
            lines = [f"data: {json.dumps(event)}\n\n".encode() for event in events]
            lines.append(b"data: [DONE]\n\n")
            written, whole = 0, sum(len(line) for line in lines)
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for index, data in enumerate(lines):
                    if delay and index:
                        time.sleep(delay)
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                    written += len(data)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client went away mid-stream
            server.streamed.append((written, whole, time.monotonic()))

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout, a killed worker)

    return Handler


def main(argv: list[str] | None = None) -> None:
    """Serve in this process until killed: ``python -m tests.support.llm_server [--delay S]``;
    prints the ``api_base`` URL as its first line (benchmarks run it apart from the worker under
    test)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds every reply waits")
    parser.add_argument("--reply", help="answer every request with this text (no summary work)")
    options = parser.parse_args(argv)
    fixed = options.reply
    default = stand_in_summary if fixed is None else (lambda _body: str(fixed))
    server = LLMServer(default=default, default_delay=options.delay).start()
    print(server.url, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
