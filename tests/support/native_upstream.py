"""A stand-in upstream that speaks the Responses API (``POST /v1/responses``) and Anthropic's
Messages API (``POST /v1/messages``) natively, on 127.0.0.1 in a thread, and validates what it
is sent as the providers do:

- Responses: a reasoning item's ``encrypted_content`` is sealed (an HMAC of the model and the
  item) and refused (400 ``invalid_encrypted_content``) when changed by a byte or sent to
  another model; a reasoning item must be followed by another item; a built-in tool item
  (``web_search_call``) must be one this server made for the model; a function call output
  must answer a call sent before it.
- Messages: a thinking block's signature seals the model, the thinking and the tool uses of
  the assistant message it was made in (a block changed, moved out of its tool loop or sent to
  another model is refused); with thinking on, the last assistant message of a tool loop in
  progress must start with its thinking block; a tool result must answer a tool use.

Compaction: ``POST /v1/responses/compact`` answers the input's user messages kept verbatim and
one ``compaction`` item whose ``encrypted_content`` is sealed like a reasoning item's (refused
when changed by a byte or sent to another model); a Messages request with a
``compact_20260112`` edit (and the ``compact-2026-01-12`` beta header, else 400) answers one
``compaction`` block (its signature seals the model and the summary) and ``stop_reason:
"compaction"``; a block changed or sent to another model is refused. ``compaction_failure``
makes both fail: ``"http"`` (500), ``"shape"`` (200 with no compaction item) or ``"slow"`` (an
answer later than any timeout under test).

It answers by script: a user message asking to "use tool" gets reasoning and a function call
(a tool use), a tool output gets reasoning and a text, "search" gets a web search item and a
text. Each item is written as compact JSON, so a test can look for its exact bytes in every
later request (``requests``, raw).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SECRET = b"stand-in-provider-secret"
SEALED = ("reasoning", "web_search_call", "thinking", "redacted_thinking", "compaction")
COMPACT_BETA = "compact-2026-01-12"
SLOW_SECONDS = 3.0  # a "slow" compaction answers after this long
REASONING_TOKENS = 37  # what the usage reports for each reply's reasoning


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def seal(*parts: str) -> str:
    return hmac.new(SECRET, "\x1f".join(parts).encode(), hashlib.sha256).hexdigest()


@dataclass
class Seen:
    """One request: its path, raw bytes, JSON and the status answered."""

    path: str
    raw: bytes
    body: dict[str, Any]
    status: int = 200
    error: str = ""
    made: list[str] = field(default_factory=list)  # the sealed items of its reply (JSON text)
    headers: dict[str, str] = field(default_factory=dict)  # as sent, names in lower case


@dataclass
class NativeUpstream:
    """The server's state: every request, the items it made (raw JSON text and model)."""

    port: int = 0
    requests: list[Seen] = field(default_factory=list)
    made: list[tuple[str, str]] = field(default_factory=list)  # (model, item's JSON text)
    tools_made: dict[str, str] = field(default_factory=dict)  # built-in item id -> model
    counter: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    compaction_failure: str = ""  # "", "http", "shape" or "slow" (see the module's docstring)

    def next(self) -> int:
        with self.lock:
            self.counter += 1
            return self.counter

    @property
    def refused(self) -> list[Seen]:
        return [r for r in self.requests if r.status != 200]

    # --- Responses -----------------------------------------------------------------------

    def check_responses(self, body: dict[str, Any]) -> str | None:
        model, items = body.get("model"), body.get("input")
        if not isinstance(items, list):
            return "input must be a list"
        calls: set[str] = set()
        for index, item in enumerate(items):
            kind = item.get("type", "message")
            if kind == "reasoning":
                encrypted = str(item.get("encrypted_content") or "")
                payload, _, mac = encrypted.rpartition(".")
                if not hmac.compare_digest(seal(str(model), payload), mac):
                    return f"invalid_encrypted_content: item {item.get('id')} cannot be verified"
                if index + 1 >= len(items) or items[index + 1].get("type") == "reasoning":
                    return (
                        f"Item '{item.get('id')}' of type 'reasoning' was provided without its "
                        "required following item."
                    )
            elif kind == "compaction":
                encrypted = str(item.get("encrypted_content") or "")
                payload, _, mac = encrypted.rpartition(".")
                if not hmac.compare_digest(seal(str(model), payload), mac):
                    return f"invalid_encrypted_content: item {item.get('id')} cannot be verified"
            elif kind == "web_search_call":
                if self.tools_made.get(str(item.get("id"))) != model:
                    return f"Item '{item.get('id')}' of type 'web_search_call' is not this model's"
            elif kind == "function_call":
                calls.add(str(item.get("call_id")))
            elif kind == "function_call_output" and item.get("call_id") not in calls:
                call_id = item.get("call_id")
                return f"No tool call found for function call output with call_id {call_id}."
        return None

    def responses_reply(self, body: dict[str, Any]) -> dict[str, Any]:
        model, items = str(body.get("model")), body["input"]
        last = items[-1]
        n = self.next()
        output: list[dict[str, Any]] = []
        text = _text(last.get("content")) if last.get("type", "message") == "message" else ""
        payload = base64.b64encode(dumps({"n": n, "thought": f"plan {n}"}).encode()).decode()
        reasoning = {
            "type": "reasoning",
            "id": f"rs_{n}",
            "summary": [{"type": "summary_text", "text": f"I thought about step {n}."}],
            "encrypted_content": f"{payload}.{seal(model, payload)}",
        }
        if "search" in text:
            search: dict[str, Any] = {"type": "web_search_call", "id": f"ws_{n}"}
            search["status"] = "completed"
            search["action"] = {"type": "search", "query": text[:40]}
            self.tools_made[search["id"]] = model
            output += [search, _message(n, f"found {n}")]
        elif "use tool" in text:
            call = {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}"}
            call.update({"name": "lookup", "arguments": dumps({"n": n}), "status": "completed"})
            output += [reasoning, call]
        else:
            output += [reasoning, _message(n, f"answer {n} to {text[:30]}")]
        for item in output:
            self.made.append((model, dumps(item)))
        usage = {
            "input_tokens": len(dumps(items)) // 4,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 50,
            "output_tokens_details": {"reasoning_tokens": REASONING_TOKENS},
            "total_tokens": len(dumps(items)) // 4 + 50,
        }
        return {
            "id": f"resp_up_{n}",
            "object": "response",
            "created_at": 1,
            "status": "completed",
            "model": model,
            "output": output,
            "usage": usage,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }

    def compact_reply(self, body: dict[str, Any]) -> dict[str, Any]:
        """``/responses/compact``: the user messages kept, one sealed compaction item."""
        model, items = str(body.get("model")), body["input"]
        n = self.next()
        kept = [
            {"type": "message", "role": "user", "content": i.get("content")}
            for i in items
            if i.get("type", "message") == "message" and i.get("role") == "user"
        ]
        payload = base64.b64encode(dumps({"n": n, "compacted": len(items)}).encode()).decode()
        item = {
            "type": "compaction",
            "id": f"cmp_{n}",
            "encrypted_content": f"{payload}.{seal(model, payload)}",
        }
        self.made.append((model, dumps(item)))
        output = [] if self.compaction_failure == "shape" else [*kept, item]
        usage = {
            "input_tokens": len(dumps(items)) // 4,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 30,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": len(dumps(items)) // 4 + 30,
        }
        return {
            "id": f"cmp_up_{n}",
            "object": "response.compaction",
            "created_at": 1,
            "output": output,
            "usage": usage,
        }

    # --- Messages ------------------------------------------------------------------------

    def check_messages(self, body: dict[str, Any]) -> str | None:
        model, messages = str(body.get("model")), body.get("messages")
        if not isinstance(messages, list) or not messages:
            return "messages: at least one message is required"
        uses: set[str] = set()
        for index, message in enumerate(messages):
            content = message.get("content")
            blocks = content if isinstance(content, list) else []
            if message.get("role") == "assistant":
                ids = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
                uses.update(ids)
                for block in blocks:
                    signed = seal(model, "compaction", str(block.get("content")))
                    if block.get("type") == "compaction" and block.get("signature") != signed:
                        return f"messages.{index}: Invalid `signature` in `compaction` block"
                for block in blocks:
                    if block.get("type") == "thinking":
                        signed = seal(model, str(block.get("thinking")), *ids)
                        if block.get("signature") != signed:
                            return f"messages.{index}: Invalid `signature` in `thinking` block"
            else:
                for block in blocks:
                    if block.get("type") == "tool_result" and block.get("tool_use_id") not in uses:
                        return f"messages.{index}: unexpected `tool_use_id` in `tool_result`"
        last = messages[-1]
        in_loop = last.get("role") == "user" and any(
            isinstance(b, dict) and b.get("type") == "tool_result"
            for b in (last.get("content") if isinstance(last.get("content"), list) else [])
        )
        thinking_on = isinstance(body.get("thinking"), dict)
        if in_loop and thinking_on and len(messages) > 1:
            first = (messages[-2].get("content") or [{}])[0]
            if not isinstance(first, dict) or first.get("type") not in (
                "thinking",
                "redacted_thinking",
            ):
                return (
                    "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but "
                    "found `tool_use`. When `thinking` is enabled, a final `assistant` message "
                    "must start with a thinking block"
                )
        return None

    def messages_reply(self, body: dict[str, Any]) -> dict[str, Any]:
        model, last = str(body.get("model")), body["messages"][-1]
        n = self.next()
        edits = (body.get("context_management") or {}).get("edits") or []
        if any(e.get("type") == "compact_20260112" for e in edits):
            summary = f"compacted {len(body['messages'])} turns"
            block = {"type": "compaction", "content": summary}
            block["signature"] = seal(model, "compaction", summary)
            self.made.append((model, dumps(block)))
            blocks = [] if self.compaction_failure == "shape" else [block]
            usage = {"input_tokens": len(dumps(body["messages"])) // 4, "output_tokens": 20}
            return {
                "id": f"msg_up_{n}",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": blocks,
                "stop_reason": "compaction",
                "stop_sequence": None,
                "usage": usage,
            }
        content = last.get("content")
        text = content if isinstance(content, str) else _text(content)
        thought = f"thinking step {n}"
        if "use tool" in text:
            use: dict[str, Any] = {"type": "tool_use", "id": f"toolu_{n}", "name": "lookup"}
            use["input"] = {"n": n}
            thinking = {"type": "thinking", "thinking": thought}
            thinking["signature"] = seal(model, thought, use["id"])
            blocks, stop = [thinking, use], "tool_use"
        else:
            thinking = {"type": "thinking", "thinking": thought, "signature": seal(model, thought)}
            blocks, stop = [thinking, {"type": "text", "text": f"answer {n}"}], "end_turn"
        for block in blocks:
            self.made.append((model, dumps(block)))
        usage = {"input_tokens": len(dumps(body["messages"])) // 4, "output_tokens": 40}
        usage.update({"cache_read_input_tokens": 0, "cache_creation_input_tokens": 0})
        return {
            "id": f"msg_up_{n}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": blocks,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _message(n: int, text: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {
        "type": "message",
        "id": f"msg_{n}",
        "status": "completed",
        "role": "assistant",
        "content": [part],
    }


def _handler(state: NativeUpstream) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.loads(raw or b"{}")
            sent_headers = {k.lower(): v for k, v in self.headers.items()}
            seen = Seen(self.path, raw, body, headers=sent_headers)
            state.requests.append(seen)
            anthropic = self.path.rstrip("/").endswith("/v1/messages")
            if isinstance(body.get("input"), str):  # a string is one user message
                body["input"] = [{"role": "user", "content": body["input"]}]
            compacting = self.path.rstrip("/").endswith("/responses/compact") or any(
                e.get("type") == "compact_20260112"
                for e in (body.get("context_management") or {}).get("edits") or ()
            )
            if compacting and state.compaction_failure == "slow":
                time.sleep(SLOW_SECONDS)
            if compacting and state.compaction_failure == "http":
                seen.status, seen.error = 500, "compaction is unavailable"
                self._send(500, {"error": {"type": "server_error", "message": seen.error}})
                return
            error: str | None
            if self.path.rstrip("/").endswith("/responses/compact"):
                error = state.check_responses(body)
                reply = None if error else state.compact_reply(body)
            elif self.path.rstrip("/").endswith("/responses"):
                error = state.check_responses(body)
                reply = None if error else state.responses_reply(body)
            elif anthropic:
                error = state.check_messages(body)
                beta = COMPACT_BETA in str(self.headers.get("anthropic-beta") or "")
                if error is None and compacting and not beta:
                    error = f"context_management compaction needs the {COMPACT_BETA} beta"
                reply = None if error else state.messages_reply(body)
            else:
                error, reply = f"unknown path {self.path}", None
            if error is not None or reply is None:
                seen.status, seen.error = 400, str(error)
                detail = {"type": "invalid_request_error", "message": error}
                payload = {"type": "error", "error": detail} if anthropic else {"error": detail}
                self._send(400, payload)
                return
            items = reply.get("output") or reply.get("content") or ()
            seen.made = [dumps(item) for item in items if item.get("type") in SEALED]
            self._send(200, reply)

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout)
                return

    return Handler


class Running:
    """A started stand-in: its state, its base URL (ending in ``/v1``), and ``stop``."""

    def __init__(self) -> None:
        self.state = NativeUpstream()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state))
        self.state.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        """The base URL (ending in ``/v1``), as ``tests.support.serving`` reads a stand-in's."""
        return f"http://127.0.0.1:{self.state.port}/v1"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def compacted_host_run(state: NativeUpstream, url: str, folder: str, mode: str) -> dict[str, Any]:
    """One host conversation through the Python API (``recap.Recap``, ``recap.native``) with
    provider compaction on: long turns for ``openai/stand-a``, one forced compression while the
    stand-in's compaction fails as ``mode`` says ("" for none), then the next request built for
    that model and for ``openai/stand-b`` and sent to the stand-in with the official openai
    client. What a test or a bench checks: the summary's text and provider items, the statuses,
    the requests' items."""
    import openai

    from recap import native
    from recap.core.client import Recap
    from recap.core.settings import Settings

    settings = Settings(
        database_url=f"sqlite:///{folder}/recap.db",
        upstream_api_base=url,
        upstream_api_key="k",
        provider_compaction="auto",
        summary_model=None,
        llm_timeout=1.5,
        activation_horizon_requests=0,
    )
    recap = Recap(settings, create_schema=True)
    cid = recap.new(model="openai/stand-a", max_input_tokens=3_000)
    for n in range(8):
        words = " ".join(f"host{n}w{i}" for i in range(110))
        recap.add(cid, {"role": "user", "content": f"turn {n}: {words}"})
        recap.add(cid, {"role": "assistant", "content": f"noted {n}"})
    recap.add(cid, {"role": "user", "content": "what now?"})
    state.compaction_failure = mode
    try:
        result = recap.compress(cid, force=True)
    finally:
        state.compaction_failure = ""
    [summary] = recap.summaries(cid)
    client = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
    out: dict[str, Any] = {"action": str(result.action), "summary": summary, "sent": {}}
    for model in ("openai/stand-a", "openai/stand-b"):
        assembled = recap.assemble(cid, model=model, max_input_tokens=3_000)
        report = native.Report()
        _instructions, items = native.responses_input(assembled.messages, model, report)
        reply = client.responses.with_raw_response.create(model=model[7:], input=items)
        out["sent"][model] = (reply.status_code, report, dumps(items))
    recap.engine.dispose()
    return out
