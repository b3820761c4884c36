"""`recap serve` against hostile clients and a broken upstream: never a 500, never half a reply
stored, never a secret echoed, never a traceback or a server path shown.

A real serve process on each upstream path (direct and litellm) in front of a stand-in upstream
scripted to misbehave (``tests.support.hostile_upstream``); requests sent with the official `openai`
client where it can send them and as raw HTTP where it cannot (a body nested 100,000 deep, a
5,000-digit number, bytes that are not UTF-8).
"""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import anthropic
import httpx
import openai
import pytest
from sqlalchemy import Engine, select

from recap.core.storage.db import make_engine
from recap.core.storage.migrate import upgrade
from recap.core.storage.models import MESSAGES
from tests.support.hostile_upstream import (
    Answer,
    HostileUpstream,
    chunk,
    completion,
    json_answer,
    stream_answer,
    text_chunks,
)
from tests.support.processes import wait_for
from tests.support.serve_stack import serve_env, serve_process

KEY = "client-key-hostile-1111"
UPSTREAM_KEY = "sk-upstream-hostile-0123456789abcdef"
SUMMARY_KEY = "sk-summary-hostile-fedcba9876543210"
DB_PASSWORD = "db-pass-w0rd-hostile"
MODEL = "openai/stand-in"
WINDOW = 8_000
BODY_LIMIT = 2_000_000  # room for the deep and long hostile bodies, which are all under it
WAIT = 60.0  # seconds a streamed reply may take to be stored after the stream ended
TRACEBACK = re.compile(r"Traceback|File \"|\.py\b|site-packages|/usr/|/home/|/tmp/|/root/")


# --- the pure parts ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "deeper than 64"),
        (b'{"a":' + b"[" * 65 + b"]" * 65 + b"}", "deeper than 64"),
        (b'{"n":' + b"9" * 5_000 + b"}", "5000 digits"),
        (b'{"n":' + b"9" * 20 + b"}", "does not fit in 64 bits"),
        (b'{"n":NaN}', "NaN is not valid JSON"),
        (b'{"n":-Infinity}', "-Infinity is not valid JSON"),
        (b'{"n":1e400}', "too large for a double"),
        (b'{"s":"\\ud800"}', "lone surrogate"),
        (b'{"s":"\xff"}', "not valid UTF-8"),
        (b"{", "not valid JSON"),
        (b"[]", "must be a JSON object"),
    ],
)
def test_the_reader_refuses_with_one_line(body: bytes, fragment: str) -> None:
    """Each hostile body is one 400 naming why, raised while parsing or right after."""
    from recap.workers.serve.errors import ServeError
    from recap.workers.serve.reader import parse_object

    with pytest.raises(ServeError) as caught:
        parse_object(body)
    assert caught.value.status == 400 and fragment in caught.value.message


def test_the_reader_takes_what_clients_send() -> None:
    """Ordinary bodies: 64-bit integers, floats, 64 levels, any script, a BOM."""
    from recap.workers.serve.reader import parse_object

    deep = "[" * 63 + "]" * 63
    body = f'{{"seed": {-(2**63)}, "t": 0.7, "d": {deep}, "s": "会话 🙂"}}'
    assert parse_object(("\ufeff" + body).encode())["s"] == "会话 🙂"


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("conv-1", "conv-1"),
        ("a:b/c@d?e=f", "a:b/c@d?e=f"),
        ("chat-会话", "chat-%E4%BC%9A%E8%AF%9D"),
        ("100%", "100%25"),
        ("a b", "a%20b"),
        ("emoji-🙂", "emoji-%F0%9F%99%82"),
    ],
)
def test_header_values_round_trip(value: str, written: str) -> None:
    """The header rule: printable ASCII but space and % as it is, the rest percent-encoded
    UTF-8; decoding gives the value back, and raw UTF-8 (as Latin-1) is read too."""
    from recap.workers.serve import headers

    assert headers.encode(value) == written
    assert headers.decode(written) == value
    if "%" not in value:  # a client writing the id's raw UTF-8 bytes is understood too
        assert headers.decode(value.encode("utf-8").decode("latin-1")) == value


def test_a_header_that_is_not_utf8_is_refused() -> None:
    from recap.workers.serve import headers

    for raw in ("\xff\xfe", "%FF%FE"):
        with pytest.raises(ValueError):
            headers.decode(raw)


def test_a_stream_masker_equals_masking_the_whole_text() -> None:
    """Seeded random splits of texts around known secrets and URL passwords: the pieces let
    out, joined, equal the whole text masked at once."""
    import random

    from recap.core.redact import StreamMasker, mask_known

    secrets = [UPSTREAM_KEY, SUMMARY_KEY, DB_PASSWORD]
    words = [*secrets, "sk-", "s", "postgres://", "u:p@h", "db-", "Note:", "x", " ", "//", "@"]
    rng = random.Random(27)
    for _ in range(500):
        text = "".join(rng.choice(words) for _ in range(rng.randint(0, 12)))
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 6))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        masker = StreamMasker(secrets)
        out = "".join(masker.feed("k", piece) for piece in pieces) + masker.flush("k")
        assert out == mask_known(text, secrets), pieces


def test_every_api_relays_each_text_masked_as_a_whole() -> None:
    """Seeded random replies (reasoning, then text, then up to two tool calls, empty chunks
    between), each text built around known secrets and URL passwords and split at random: the
    chunks the shared relay lets out, and the Responses and Messages events made of them, give
    each text exactly as masking it whole would, in the order the upstream sent them
    (``tests.hostile_upstream.relay_mismatches``; ``bench.serve_hostile`` runs 20,000)."""
    import random

    from tests.support.hostile_upstream import random_reply, relay_mismatches

    secrets = [UPSTREAM_KEY, SUMMARY_KEY, DB_PASSWORD]
    rng = random.Random(2027)
    for _ in range(300):
        reply = random_reply(rng, secrets)
        assert relay_mismatches(reply, secrets) == [], reply.texts


@pytest.mark.parametrize(
    "spelled",
    [
        UPSTREAM_KEY,
        UPSTREAM_KEY.replace("s", "\\u0073"),  # a JSON escape: the bytes never hold the key
        "postgres://app:hunter2-secret@db/x",
        "postgres:\\/\\/app:hunter2-secret@db\\/x",  # an escaped slash
    ],
    ids=["plain", "escaped letter", "url", "escaped slash"],
)
def test_a_secret_in_a_chunks_other_strings_is_masked(spelled: str) -> None:
    """A known secret or a URL password in a chunk's other strings (the model, a tool call's
    name), however the upstream's JSON spells it: masked in what the relay lets out."""
    import asyncio

    from recap.workers.serve.direct import Chunk
    from recap.workers.serve.streaming import Relay

    call = '{"index":0,"id":"k","function":{"name":"SPELLED","arguments":""}}'
    raw = (
        (
            '{"id":"c","object":"chat.completion.chunk","model":"SPELLED","choices":[{"index":0,'
            f'"delta":{{"tool_calls":[{call}]}},"finish_reason":"tool_calls"}}]}}'
        )
        .replace("SPELLED", spelled)
        .encode()
    )

    async def stream() -> Any:
        yield Chunk(raw, json.loads(raw))

    async def read() -> list[Any]:
        relay = Relay(stream(), include_usage=True, secrets=[UPSTREAM_KEY])
        return [(sent, data) async for sent, data in relay.checked()]

    [(sent, data)] = asyncio.run(read())
    assert sent is None  # not the upstream's bytes: they were changed
    text = json.dumps(data)
    assert UPSTREAM_KEY not in text and "hunter2" not in text, text


def test_streamed_thinking_blocks_join_as_litellm_joins_them() -> None:
    """Seeded random thinking-block pieces (text, signatures, redacted blocks) as a stream's
    deltas carry them: the stored reply's blocks equal litellm's own joining of them."""
    import random

    from litellm.litellm_core_utils.streaming_chunk_builder_utils import ChunkProcessor

    from recap.workers.serve.direct import Chunk, build_from_chunks

    rng = random.Random(31)
    for _ in range(300):
        pieces: list[dict[str, Any]] = []
        for _ in range(rng.randint(0, 8)):
            roll = rng.random()
            if roll < 0.15:
                pieces.append({"type": "redacted_thinking", "data": f"r{rng.randint(0, 9)}"})
            elif roll < 0.4:
                pieces.append({"type": "thinking", "thinking": "", "signature": f"s{len(pieces)}"})
            else:
                pieces.append({"type": "thinking", "thinking": rng.choice(["a", "bc", " d"])})
        chunks = [chunk({"content": "x", "thinking_blocks": [p]}) for p in pieces]
        chunks.append(chunk({}, "stop"))
        ours = build_from_chunks([Chunk(b"", c) for c in chunks])["choices"][0]["message"]
        theirs = ChunkProcessor(chunks).get_combined_thinking_content(chunks) or []
        assert ours.get("thinking_blocks", []) == [dict(b) for b in theirs], pieces


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (
            'boom\nTraceback (most recent call last):\n  File "/srv/app/x.py", line 3, in f',
            "boom",
        ),
        ('File "/usr/lib/python3.11/site.py", line 9 bad', "(server file) bad"),
        ("at /home/u/.venv/lib/site-packages/litellm/main.py", "at (server path)"),
        ("see http://127.0.0.1:8080/v1/chat, a/b", "see http://127.0.0.1:8080/v1/chat, a/b"),
    ],
)
def test_client_text_drops_tracebacks_and_paths(text: str, shown: str) -> None:
    from recap.workers.serve.errors import client_text

    assert client_text(text) == shown


@dataclass
class Serve:
    base_url: str
    engine: Engine
    upstream: HostileUpstream
    log: Path
    path: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key=KEY, max_retries=0, timeout=60)

    def rows(self, cid: str) -> list[tuple[str, Any]]:
        m = MESSAGES.c
        with self.engine.connect() as connection:
            statement = select(m.role, m.content).where(m.conversation_id == cid).order_by(m.id)
            return [(str(r[0]), r[1]) for r in connection.execute(statement)]

    def post(self, body: bytes | dict[str, Any], cid: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        if cid is not None:
            headers["X-Recap-Conversation"] = cid
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.post(
            f"{self.base_url}/chat/completions", content=content, headers=headers, timeout=60
        )


@pytest.fixture(scope="module")
def upstream() -> Iterator[HostileUpstream]:
    server = HostileUpstream().start()
    yield server
    server.stop()


def _running(folder: Path, upstream: HostileUpstream, client: str, **extra: str) -> Iterator[Serve]:
    url = f"sqlite:///{folder / 'recap.db'}"
    engine = make_engine(url)
    upgrade(engine)
    env = serve_env(
        url,
        folder,
        keys=KEY,
        upstream=upstream.url,
        upstream_key=UPSTREAM_KEY,
        window=WINDOW,
        RECAP_UPSTREAM_CLIENT=client,
        RECAP_SUMMARY_API_KEY=SUMMARY_KEY,
        RECAP_RESULT_BACKEND=f"redis://recap:{DB_PASSWORD}@127.0.0.1:1/0",
        RECAP_SERVE_MAX_BODY_BYTES=str(BODY_LIMIT),
        **extra,
    )
    try:
        with serve_process(env, folder) as process:
            yield Serve(process.base_url, engine, upstream, process.log, client)
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def serve_direct(
    upstream: HostileUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Serve]:
    yield from _running(tmp_path_factory.mktemp("hostile-direct"), upstream, "direct")


@pytest.fixture(scope="module")
def serve_litellm(
    upstream: HostileUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Serve]:
    yield from _running(tmp_path_factory.mktemp("hostile-litellm"), upstream, "litellm")


@pytest.fixture(scope="module")
def serve_recall(
    upstream: HostileUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Serve]:
    """A serve process that offers the model ``recap_recall`` and answers its calls."""
    folder = tmp_path_factory.mktemp("hostile-recall")
    yield from _running(folder, upstream, "direct", RECAP_SERVE_RECALL="true")


@pytest.fixture(params=["direct", "litellm"])
def serve(request: pytest.FixtureRequest) -> Iterator[Serve]:
    """Both upstream paths; the script is cleared after each test."""
    running: Serve = request.getfixturevalue(f"serve_{request.param}")
    yield running
    running.upstream.clear()


def new_id() -> str:
    return f"hostile-{uuid.uuid4().hex[:10]}"


def user(text: str = "hello") -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def clean(text: str) -> None:
    """No traceback, server path or configured secret in what a client was shown."""
    assert not TRACEBACK.search(text), text
    for secret in (UPSTREAM_KEY, SUMMARY_KEY, DB_PASSWORD, "sk-upstream-hostile"):
        assert secret not in text, text


# --- hostile bodies: 400 in the OpenAI format, nothing stored ------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000
BIG = "9" * 5_000


def _body(**fields: str) -> bytes:
    """A chat request as JSON text, some fields given as raw JSON text."""
    parts = {"model": json.dumps(MODEL), "messages": json.dumps(user()), **fields}
    return ("{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in parts.items()) + "}").encode()


RAW_BODIES: list[tuple[str, bytes]] = [
    ("deep metadata", _body(metadata='{"a":' + DEEP + "}")),
    ("deep content", _body(messages='[{"role":"user","content":' + DEEP + "}]")),
    ("deep parameter", _body(response_format=DEEP)),
    ("5000-digit integer", _body(max_tokens=BIG)),
    ("5000-digit integer in metadata", _body(metadata='{"n":' + BIG + "}")),
    ("NaN (the openai client refuses to send it)", _body(temperature="NaN")),
    ("Infinity", _body(top_p="Infinity")),
    ("overflowing float", _body(temperature="1e999")),
    ("not UTF-8", b'{"model":"m","messages":[{"role":"user","content":"\xff\xfe"}]}'),
    ("lone surrogate", _body(messages='[{"role":"user","content":"\\ud800"}]')),
    ("not JSON", b"{'model': 1"),
    ("a JSON array", b"[1, 2]"),
    ("empty", b""),
]


@pytest.mark.parametrize(("case", "body"), RAW_BODIES, ids=[c for c, _ in RAW_BODIES])
def test_a_hostile_body_is_400_and_stores_nothing(serve: Serve, case: str, body: bytes) -> None:
    """Bodies no client library sends: a 400 in the OpenAI format, nothing stored or sent."""
    cid = new_id()
    before = len(serve.upstream.requests)
    response = serve.post(body, cid)
    assert response.status_code == 400, (case, response.text)
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    clean(response.text)
    assert serve.rows(cid) == []
    assert len(serve.upstream.requests) == before


CALL = {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
SDK_BODIES: list[tuple[str, dict[str, Any]]] = [
    ("content a list of numbers", {"messages": [{"role": "user", "content": [1, 2]}]}),
    (
        "a part of unknown type",
        {"messages": [{"role": "user", "content": [{"type": "zzz", "text": "x"}]}]},
    ),
    ("user content null", {"messages": [{"role": "user", "content": None}]}),
    ("user without content", {"messages": [{"role": "user"}]}),
    ("assistant null without calls", {"messages": [*user(), {"role": "assistant"}, *user()]}),
    ("content an object", {"messages": [{"role": "user", "content": {"a": 1}}]}),
    (
        "a tool call id not a string",
        {"messages": [*user(), {"role": "assistant", "tool_calls": [{**CALL, "id": True}]}]},
    ),
    (
        "a tool_call_id not a string",
        {
            "messages": [
                *user(),
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": 1, "content": "x"},
            ]
        },
    ),
    ("temperature a string", {"messages": user(), "temperature": "hot"}),
    ("temperature true", {"messages": user(), "temperature": True}),
    ("max_tokens a float", {"messages": user(), "max_tokens": 1.5}),
    ("max_tokens past 64 bits", {"messages": user(), "max_tokens": 2**70}),
    ("seed negative past 64 bits", {"messages": user(), "seed": -(2**70)}),
    ("stop a number", {"messages": user(), "stop": 5}),
    ("logit_bias a list", {"messages": user(), "logit_bias": [1]}),
    ("tools an object", {"messages": user(), "tools": {"a": 1}}),
    ("metadata a list", {"messages": user(), "metadata": [1]}),
    ("metadata conversation a number", {"messages": user(), "metadata": {"recap_conversation": 7}}),
    ("stream a string", {"messages": user(), "stream": "yes"}),
    ("stream_options a list", {"messages": user(), "stream": True, "stream_options": [1]}),
    ("role unknown", {"messages": [{"role": "wizard", "content": "x"}]}),
    ("message a string", {"messages": ["hello"]}),
    ("model a number", {"model": 5, "messages": user()}),
]


@pytest.mark.parametrize(("case", "fields"), SDK_BODIES, ids=[c for c, _ in SDK_BODIES])
def test_an_invalid_request_is_400_and_stores_nothing(
    serve: Serve, case: str, fields: dict[str, Any]
) -> None:
    """Invalid requests the openai client sends as given: a 400 naming the problem, nothing
    stored, nothing sent upstream (stored turn and pass-through alike)."""
    before = len(serve.upstream.requests)
    for cid in (new_id(), None):
        body: dict[str, Any] = {"model": MODEL, **fields}
        extra = {k: v for k, v in body.items() if k not in ("model", "messages")}
        headers = {"X-Recap-Conversation": cid} if cid else {}
        with pytest.raises(openai.BadRequestError) as caught:
            serve.client().chat.completions.create(
                model=body["model"],
                messages=body["messages"],
                extra_headers=headers,
                extra_body=extra,
            )
        assert isinstance(caught.value.body, dict) and caught.value.body["message"], case
        clean(json.dumps(caught.value.body))
        if cid is not None:
            assert serve.rows(cid) == []
    assert len(serve.upstream.requests) == before


# --- conversation ids of any script ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["chat-会话", "naïve-café", "emoji-🙂", "percent-100%-sure"])
def test_a_conversation_id_of_any_script_round_trips(serve: Serve, name: str) -> None:
    """A non-latin-1 id by metadata is stored and answered with a percent-encoded header that
    decodes back to it; the header value sent back names the same conversation."""
    cid = f"{name}-{uuid.uuid4().hex[:6]}"
    client = serve.client()
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=user("first"), metadata={"recap_conversation": cid}
    )
    header = raw.headers["x-recap-conversation"]
    assert header.isascii() and unquote(header) == cid
    reply = raw.parse().choices[0].message.content
    again = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[*user("first"), {"role": "assistant", "content": reply}, *user("second")],
        extra_headers={"X-Recap-Conversation": header},
    )
    assert again.headers["x-recap-conversation"] == header
    assert [r[0] for r in serve.rows(cid)] == ["user", "assistant", "user", "assistant"]


# --- a broken upstream ---------------------------------------------------------------------------


def stream_text(serve: Serve, cid: str, **kwargs: Any) -> str:
    stream = serve.client().chat.completions.create(
        model=MODEL,
        messages=user(),
        stream=True,
        extra_headers={"X-Recap-Conversation": cid},
        **kwargs,
    )
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


# A whole JSON reply to a streamed request, and what the client's stream then reads: the text,
# the tool call names, and whether the reply is stored (None: the stream ends with an error).
WHOLE_REPLIES: list[tuple[str, Answer, str | None]] = [
    ("text", json_answer(completion("a whole answer at once")), "a whole answer at once"),
    (
        "a tool call",
        json_answer(completion(None, tool_calls=[CALL], finish="tool_calls")),
        "call:ls",
    ),
    (
        "reasoning and text",
        json_answer(completion("the answer", reasoning_content="thought first")),
        "the answer",
    ),
    ("no usage", json_answer({**completion("no usage here"), "usage": None}), "no usage here"),
    ("no choices", json_answer({"object": "chat.completion", "choices": []}), None),
    ("content an object", json_answer(completion(None, content={"weird": 1})), None),
]


def _streamed(serve: Serve, cid: str, model: str, include_usage: bool) -> tuple[str, bool]:
    """The text (and tool call names) a streamed request reads, and whether usage came."""
    stream = serve.client().chat.completions.create(
        model=model,
        messages=user(),
        stream=True,
        stream_options={"include_usage": include_usage},
        extra_headers={"X-Recap-Conversation": cid},
    )
    said, usage = [], False
    for item in stream:
        usage |= item.usage is not None
        for choice in item.choices:
            said.append(choice.delta.content or "")
            said += [f"call:{c.function.name}" for c in choice.delta.tool_calls or () if c.function]
    return "".join(said), usage


@pytest.mark.parametrize("include_usage", [True, False], ids=["usage", "no-usage"])
@pytest.mark.parametrize(
    ("case", "answer", "expected"), WHOLE_REPLIES, ids=[c for c, _, _ in WHOLE_REPLIES]
)
def test_plain_json_to_a_streamed_request_is_one_chunk(
    serve: Serve, case: str, answer: Answer, expected: str | None, include_usage: bool
) -> None:
    """An upstream that ignores ``stream`` (on either path; litellm reads such a body as an
    empty stream, so the litellm path reads the body under it): the reply relayed as a valid
    stream of one chunk, usage when asked for, and stored once; a malformed one ends the
    stream with an error and stores no reply. One request upstream, never a second."""
    cid = new_id()
    before = len(serve.upstream.requests)
    serve.upstream.script(answer)
    if expected is None:
        with pytest.raises(openai.APIError) as caught:
            _streamed(serve, cid, MODEL, include_usage)
        clean(str(caught.value))
        assert serve.rows(cid) == [("user", "hello")]
        return
    said, usage = _streamed(serve, cid, MODEL, include_usage)
    assert said == expected, case
    has_usage = isinstance(json.loads(answer.pieces[0]).get("usage"), dict)
    assert usage == (include_usage and has_usage), case
    wait_for(lambda: len(serve.rows(cid)) == 2, WAIT, "the reply stored")
    stored = serve.rows(cid)
    assert [role for role, _ in stored] == ["user", "assistant"]
    assert stored[1][1] == (None if expected.startswith("call:") else expected)
    assert len(serve.upstream.requests) == before + 1


def test_plain_json_from_a_provider_litellm_reads_itself_is_asked_again(
    serve_litellm: Serve,
) -> None:
    """A provider whose stream litellm reads itself (``hosted_vllm/``: no body left to read) and
    that answers a stream with one JSON body: asked once more without ``stream``, the reply
    relayed as one chunk and stored once."""
    serve = serve_litellm
    cid = new_id()
    before = len(serve.upstream.requests)
    serve.upstream.script(
        json_answer(completion("first, lost")), json_answer(completion("asked again"))
    )
    try:
        said, usage = _streamed(serve, cid, "hosted_vllm/stand-in", True)
    finally:
        serve.upstream.clear()
    assert (said, usage) == ("asked again", True)
    sent = serve.upstream.requests[before:]
    assert [bool(body.get("stream")) for body in sent] == [True, False]
    wait_for(lambda: len(serve.rows(cid)) == 2, WAIT, "the reply stored")
    assert serve.rows(cid) == [("user", "hello"), ("assistant", "asked again")]


@pytest.mark.parametrize(
    "answer",
    [
        stream_answer(text_chunks(["half an ", "answer"], finish=None), done=False),
        stream_answer(text_chunks(["half an ", "answer"], finish=None), done=True),
        stream_answer(text_chunks(["half an ", "answer"], finish=None), done=False, cut=True),
        stream_answer([chunk({"content": "half"}), {"oops": 1}], done=False),
        Answer(
            (
                b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n',
                b"data: {not json\n\n",
            ),
            content_type="text/event-stream",
        ),
    ],
    ids=["clean end, no finish", "DONE, no finish", "cut mid-stream", "bad chunk", "not JSON"],
)
def test_an_unfinished_stream_ends_with_an_error_and_stores_no_reply(
    serve: Serve, answer: Answer
) -> None:
    """A stream the upstream never finished: the client's stream ends with an error event, and
    no reply is stored (the branch ends at the request)."""
    cid = new_id()
    serve.upstream.script(answer)
    with pytest.raises(openai.APIError) as caught:
        stream_text(serve, cid)
    clean(str(caught.value))
    assert serve.rows(cid) == [("user", "hello")]


MALFORMED: list[tuple[str, Answer]] = [
    ("content an object", json_answer(completion(None, content={"weird": 1}))),
    ("no choices", json_answer({"object": "chat.completion", "choices": []})),
    ("choices an object", json_answer({"object": "chat.completion", "choices": {"a": 1}})),
    ("message a string", json_answer({"choices": [{"index": 0, "message": "hi"}]})),
    ("no content, no calls", json_answer(completion(None))),
    ("tool call id a number", json_answer(completion(None, tool_calls=[{**CALL, "id": 5}]))),
    ("not JSON", Answer((b"<html>oops</html>",), content_type="text/html")),
    ("a NUL, which no database stores", json_answer(completion("a\u0000b"))),
    ("a JSON array", json_answer([1, 2])),
]


@pytest.mark.parametrize(("case", "answer"), MALFORMED, ids=[c for c, _ in MALFORMED])
def test_a_malformed_reply_is_502_and_stores_no_reply(
    serve: Serve, case: str, answer: Answer
) -> None:
    """A 200 whose body is no chat completion: a 502 in the OpenAI format, no reply stored."""
    cid = new_id()
    serve.upstream.script(answer)
    with pytest.raises(openai.APIStatusError) as caught:
        serve.client().chat.completions.create(
            model=MODEL, messages=user(), extra_headers={"X-Recap-Conversation": cid}
        )
    assert caught.value.status_code == 502, (case, caught.value.body)
    clean(json.dumps(caught.value.body))
    assert serve.rows(cid) == [("user", "hello")]


def test_a_malformed_reply_between_recall_rounds_is_502(serve_recall: Serve) -> None:
    """With ``RECAP_SERVE_RECALL``, a round's reply is checked as the final one is: a malformed
    first reply, or a malformed reply after a recall was answered, is a 502 with no reply
    stored (it was a 500)."""
    serve = serve_recall
    recall_call = {
        "id": "call_r",
        "type": "function",
        "function": {"name": "recap_recall", "arguments": '{"ref": "nothing-here"}'},
    }
    asks = json_answer(completion(None, tool_calls=[recall_call], finish="tool_calls"))
    try:
        for case, script in [
            ("the first reply", [MALFORMED[0][1]]),
            ("after a recall", [asks, json_answer({"object": "chat.completion", "choices": []})]),
        ]:
            cid = new_id()
            serve.upstream.script(*script)
            with pytest.raises(openai.APIStatusError) as caught:
                serve.client().chat.completions.create(
                    model=MODEL, messages=user(), extra_headers={"X-Recap-Conversation": cid}
                )
            assert caught.value.status_code == 502, (case, caught.value.body)
            clean(json.dumps(caught.value.body))
            assert serve.rows(cid) == [("user", "hello")], case
    finally:
        serve.upstream.clear()


@pytest.mark.parametrize(
    ("finish", "status", "stop_reason"),
    [("length", "incomplete", "max_tokens"), ("stop", "completed", "end_turn")],
)
def test_a_reply_cut_short_says_so_in_every_api(
    serve: Serve, finish: str, status: str, stop_reason: str
) -> None:
    """A whole reply the upstream cut at its token limit: a Responses object ``incomplete``
    (``max_output_tokens``) and an Anthropic message ``stop_reason: max_tokens``, as their
    streams say (the finish reason was read from the wrong place and lost)."""
    serve.upstream.script(json_answer(completion("cut", finish=finish)))
    response = serve.client().responses.create(
        model=MODEL, input="hi", extra_headers={"X-Recap-Conversation": new_id()}
    )
    assert response.status == status
    if status == "incomplete":
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
    serve.upstream.script(json_answer(completion("cut", finish=finish)))
    message = anthropic_client(serve, new_id()).messages.create(
        model=MODEL, max_tokens=50, messages=user()
    )
    assert message.stop_reason == stop_reason


@pytest.mark.parametrize(
    "usage",
    [{"prompt_tokens": "lots", "completion_tokens": 3}, {"prompt_tokens": -5}, "many", [1]],
    ids=["a string", "negative", "usage a string", "usage a list"],
)
def test_malformed_usage_keeps_the_reply_and_records_no_usage(serve: Serve, usage: Any) -> None:
    """The reply is whole, its usage unreadable: the reply answered and stored once, no usage
    recorded, no error after the stored turn (litellm refuses some such replies itself: then a
    502 and no reply stored)."""
    cid = new_id()
    serve.upstream.script(json_answer(completion("fine text", usage=usage)))
    readable = isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int)
    if serve.path == "litellm" and not readable:
        with pytest.raises(openai.APIStatusError) as caught:
            serve.client().chat.completions.create(
                model=MODEL, messages=user(), extra_headers={"X-Recap-Conversation": cid}
            )
        assert caught.value.status_code == 502
        assert serve.rows(cid) == [("user", "hello")]
        return
    reply = serve.client().chat.completions.create(
        model=MODEL, messages=user(), extra_headers={"X-Recap-Conversation": cid}
    )
    assert reply.choices[0].message.content == "fine text"
    assert serve.rows(cid) == [("user", "hello"), ("assistant", "fine text")]


def test_an_upstream_connection_error_shows_no_traceback(serve: Serve) -> None:
    """An upstream that cuts its JSON reply short: a 502 with one clean line."""
    cid = new_id()
    serve.upstream.script(Answer((b'{"choices": [', b"{"), cut=True))
    with pytest.raises(openai.APIStatusError) as caught:
        serve.client().chat.completions.create(
            model=MODEL, messages=user(), extra_headers={"X-Recap-Conversation": cid}
        )
    assert caught.value.status_code == 502
    clean(json.dumps(caught.value.body))
    assert serve.rows(cid) == [("user", "hello")]


# --- secrets in a 200 ------------------------------------------------------------------------

LEAKY = f"use Bearer {UPSTREAM_KEY} or {SUMMARY_KEY} at postgres://app:hunter2-secret@db/x"


def _masked(text: str) -> None:
    for secret in (UPSTREAM_KEY, SUMMARY_KEY, "hunter2-secret"):
        assert secret not in text, text
    assert "postgres://app:***@db/x" in text


def test_a_secret_in_a_reply_is_masked_returned_and_stored(serve: Serve) -> None:
    """The configured keys and a URL password in the reply text: masked for the client and in
    the stored reply, the rest of the text kept."""
    cid = new_id()
    serve.upstream.script(json_answer(completion(LEAKY)))
    reply = serve.client().chat.completions.create(
        model=MODEL, messages=user(), extra_headers={"X-Recap-Conversation": cid}
    )
    _masked(str(reply.choices[0].message.content))
    _masked(str(serve.rows(cid)[-1][1]))


@pytest.mark.parametrize("size", [1, 3, 7])
def test_a_secret_split_across_chunks_is_masked(serve: Serve, size: int) -> None:
    """A key streamed a few characters at a time: never whole in what the client reads, nor in
    the stored reply."""
    cid = new_id()
    pieces = [LEAKY[i : i + size] for i in range(0, len(LEAKY), size)]
    serve.upstream.script(stream_answer(text_chunks(pieces)))
    text = stream_text(serve, cid)
    _masked(text)
    wait_for(lambda: len(serve.rows(cid)) == 2, WAIT, "the reply stored")
    _masked(str(serve.rows(cid)[-1][1]))


def test_a_secret_in_a_pass_through_reply_is_masked(serve: Serve) -> None:
    """No conversation named: the reply is still masked."""
    serve.upstream.script(json_answer(completion(LEAKY)))
    reply = serve.client().chat.completions.create(model=MODEL, messages=user())
    _masked(str(reply.choices[0].message.content))


# --- a bounded fuzz of the routes ----------------------------------------------------------------

# seeded cases per path: a fast subset by default, the full count under -m slow (bench.suite_slow);
# bench.serve_hostile runs thousands
FUZZ_CASES = {"direct": (50, 200), "litellm": (20, 60)}


@pytest.mark.parametrize("size", [0, pytest.param(1, marks=pytest.mark.slow)], ids=["fast", "full"])
def test_fuzzed_requests_never_get_a_500(serve: Serve, size: int) -> None:
    """Hypothesis over the request model (valid and invalid fields, NaN, odd JSON, ids of any
    script), seeded: no response is a 500, and nothing the upstream is sent is non-JSON."""
    from hypothesis import HealthCheck, given, seed, settings

    from tests.support.hostile_clients import fuzz_once, request_bodies

    cases = FUZZ_CASES[serve.path][size]
    statuses: Counter[int] = Counter()

    @seed(27)
    @settings(
        max_examples=cases,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(request_bodies(MODEL))
    def one(case: tuple[dict[str, Any], str | None]) -> None:
        status = fuzz_once(serve.base_url, KEY, *case)
        statuses[status] += 1
        assert status != 500, case

    one()
    assert sum(statuses.values()) >= cases // 2
    assert statuses[200] >= cases // 10 and statuses[400] > 0, statuses


def test_a_secret_in_streamed_tool_arguments_is_masked(serve: Serve) -> None:
    """A tool call's arguments carrying the upstream key in pieces: masked in the chunks the
    client reads and in the stored call."""
    cid = new_id()
    arguments = json.dumps({"header": f"Bearer {UPSTREAM_KEY}"})
    head = {"index": 0, "id": "call_k", "type": "function"}
    pieces = [arguments[i : i + 5] for i in range(0, len(arguments), 5)]
    deltas = [{"tool_calls": [{**head, "function": {"name": "curl", "arguments": ""}}]}]
    deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": p}}]} for p in pieces]
    serve.upstream.script(
        stream_answer([chunk({"role": "assistant"}), *map(chunk, deltas), chunk({}, "tool_calls")])
    )
    stream = serve.client().chat.completions.create(
        model=MODEL, messages=user(), stream=True, extra_headers={"X-Recap-Conversation": cid}
    )
    sent = "".join(
        call.function.arguments or ""
        for c in stream
        if c.choices
        for call in c.choices[0].delta.tool_calls or ()
        if call.function is not None
    )
    assert UPSTREAM_KEY not in sent and "sk-...cdef" in sent
    m = MESSAGES.c

    def stored() -> Any:
        with serve.engine.connect() as connection:
            statement = select(m.tool_calls).where(m.conversation_id == cid, m.role == "assistant")
            return connection.execute(statement).scalar()

    calls = wait_for(stored, WAIT, "the tool call stored")
    assert UPSTREAM_KEY not in json.dumps(calls) and "sk-...cdef" in json.dumps(calls)


def test_a_pass_through_reply_need_not_be_storable(serve: Serve) -> None:
    """Nothing is stored without a conversation: a reply with a NUL character is relayed."""
    serve.upstream.script(json_answer(completion("a\u0000b")))
    reply = serve.client().chat.completions.create(model=MODEL, messages=user())
    assert reply.choices[0].message.content == "a\u0000b"


# --- the Responses and Messages APIs: the same stream reading, the same masking -----------------


def anthropic_client(serve: Serve, cid: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=serve.base_url.removesuffix("/v1"),
        api_key=KEY,
        max_retries=0,
        timeout=60,
        default_headers={"X-Recap-Conversation": cid},
    )


def responses_text(serve: Serve, cid: str) -> tuple[str, str]:
    """responses.stream: the text deltas joined, and the final response's text."""
    with serve.client().responses.stream(
        model=MODEL, input="hello", extra_headers={"X-Recap-Conversation": cid}
    ) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    return text, final.output_text


def messages_text(serve: Serve, cid: str) -> tuple[str, str]:
    """messages.stream: the text deltas joined, and the final message's text."""
    with anthropic_client(serve, cid).messages.stream(
        model=MODEL, max_tokens=200, messages=user()
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    return text, "".join(b.text for b in final.content if b.type == "text")


API_TEXT = {"responses": responses_text, "messages": messages_text}


@pytest.mark.parametrize("size", [1, 3, 7])
@pytest.mark.parametrize("api", sorted(API_TEXT))
def test_a_secret_split_across_chunks_is_masked_in_every_api(
    serve: Serve, api: str, size: int
) -> None:
    """The upstream key, the summary key and a URL password streamed a few characters at a
    time to a Responses or Messages client: never whole in a delta, in the deltas joined, in
    the final object the SDK assembles, nor in the stored reply."""
    cid = new_id()
    pieces = [LEAKY[i : i + size] for i in range(0, len(LEAKY), size)]
    serve.upstream.script(stream_answer(text_chunks(pieces)))
    text, final = API_TEXT[api](serve, cid)
    _masked(text)
    assert final == text
    wait_for(lambda: len(serve.rows(cid)) == 2, WAIT, "the reply stored")
    assert serve.rows(cid)[-1][1] == text


def _call_chunks(arguments: str, size: int) -> list[dict[str, Any]]:
    """A streamed tool call whose arguments come ``size`` characters at a time."""
    head = {"index": 0, "id": "call_k", "type": "function"}
    pieces = [arguments[i : i + size] for i in range(0, len(arguments), size)]
    deltas = [{"tool_calls": [{**head, "function": {"name": "curl", "arguments": ""}}]}]
    deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": p}}]} for p in pieces]
    return [chunk({"role": "assistant"}), *map(chunk, deltas), chunk({}, "tool_calls")]


def test_a_secret_in_streamed_tool_arguments_is_masked_in_every_api(serve: Serve) -> None:
    """Tool-call arguments carrying the upstream key and a URL password in pieces: masked in
    the argument deltas of a Responses and of a Messages stream, and in the stored call."""
    arguments = json.dumps({"auth": f"Bearer {UPSTREAM_KEY}", "db": "postgres://a:hunter2@h/x"})
    cid = new_id()
    serve.upstream.script(stream_answer(_call_chunks(arguments, 4)))
    events = list(
        serve.client().responses.create(
            model=MODEL, input="hi", stream=True, extra_headers={"X-Recap-Conversation": cid}
        )
    )
    sent = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert done == [sent] and json.loads(sent)["db"] == "postgres://a:***@h/x"
    assert UPSTREAM_KEY not in sent and "hunter2" not in sent
    other = new_id()
    serve.upstream.script(stream_answer(_call_chunks(arguments, 4)))
    with anthropic_client(serve, other).messages.stream(
        model=MODEL, max_tokens=200, messages=user()
    ) as stream:
        partial = "".join(
            e.delta.partial_json
            for e in stream
            if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
        )
        final = stream.get_final_message()
    assert partial == sent
    assert [b.input for b in final.content if b.type == "tool_use"] == [json.loads(sent)]
    m = MESSAGES.c
    for conversation in (cid, other):

        def stored(conversation: str = conversation) -> Any:
            with serve.engine.connect() as connection:
                statement = select(m.tool_calls).where(
                    m.conversation_id == conversation, m.role == "assistant"
                )
                return connection.execute(statement).scalar()

        calls = json.dumps(wait_for(stored, WAIT, "the tool call stored"))
        assert UPSTREAM_KEY not in calls and "hunter2" not in calls and "sk-...cdef" in calls


def _responses_events(serve: Serve, cid: str) -> list[Any]:
    return list(
        serve.client().responses.create(
            model=MODEL, input="hello", stream=True, extra_headers={"X-Recap-Conversation": cid}
        )
    )


UNFINISHED: list[tuple[str, Answer]] = [
    ("clean end, no finish", stream_answer(text_chunks(["half an ", "answer"], finish=None))),
    (
        "DONE, no finish",
        stream_answer(text_chunks(["half an ", "answer"], finish=None), done=True),
    ),
    (
        "cut mid-stream",
        stream_answer(text_chunks(["half an ", "answer"], finish=None), done=False, cut=True),
    ),
    ("bad chunk", stream_answer([chunk({"content": "half"}), {"oops": 1}], done=False)),
    ("content a number", stream_answer([chunk({"content": 5}), chunk({}, "stop")])),
    ("nothing but a finish", stream_answer([chunk({}, "stop")])),
]


@pytest.mark.parametrize(("case", "answer"), UNFINISHED, ids=[c for c, _ in UNFINISHED])
def test_an_unfinished_stream_stores_no_reply_in_every_api(
    serve: Serve, case: str, answer: Answer
) -> None:
    """A stream the upstream never finished (or finished with no reply in it), to a Responses
    and to a Messages client: the stream ends with that API's error event, never a completed
    response, and no reply is stored."""
    cid = new_id()
    serve.upstream.script(answer)
    kinds = [e.type for e in _responses_events(serve, cid)]
    assert "response.completed" not in kinds and kinds[-2:] == ["error", "response.failed"], kinds
    other = new_id()
    serve.upstream.script(answer)
    with pytest.raises(anthropic.APIStatusError) as caught:
        messages_text(serve, other)
    clean(str(caught.value))
    assert serve.rows(cid) == [("user", "hello")], case
    assert serve.rows(other) == [("user", "hello")], case


@pytest.mark.parametrize("api", sorted(API_TEXT))
@pytest.mark.parametrize(
    "usage",
    [{"prompt_tokens": "lots", "completion_tokens": 3}, {"prompt_tokens": -5}, "many"],
    ids=["a string", "negative", "usage a string"],
)
def test_unreadable_stream_usage_keeps_the_reply_in_every_api(
    serve: Serve, api: str, usage: Any
) -> None:
    """A finished stream whose usage chunk is unreadable: the reply relayed and stored, the
    usage left out (litellm refuses some such chunks itself: then an error and no reply)."""
    cid = new_id()
    chunks = [*text_chunks(["fine ", "text"])[:-1], chunk(choices=[], usage=usage)]
    serve.upstream.script(stream_answer(chunks))
    if serve.path == "litellm" and isinstance(usage, dict) and "completion_tokens" in usage:
        if api == "responses":  # litellm's own usage model refuses a string count
            kinds = [e.type for e in _responses_events(serve, cid)]
            assert kinds[-2:] == ["error", "response.failed"], kinds
        else:
            with pytest.raises(anthropic.APIStatusError):
                messages_text(serve, cid)
        assert serve.rows(cid) == [("user", "hello")]
        return
    text, _ = API_TEXT[api](serve, cid)
    assert text == "fine text"
    wait_for(lambda: len(serve.rows(cid)) == 2, WAIT, "the reply stored")
    assert serve.rows(cid) == [("user", "hello"), ("assistant", "fine text")]


@pytest.mark.parametrize("api", sorted(API_TEXT))
def test_plain_json_to_a_streamed_request_is_one_chunk_in_every_api(serve: Serve, api: str) -> None:
    """A Responses or Messages stream answered upstream with one JSON body: the client's stream
    carries the whole text, and the reply is stored once."""
    cid = new_id()
    serve.upstream.script(json_answer(completion(f"all at once, {LEAKY}")))
    text, final = API_TEXT[api](serve, cid)
    assert text == final and text.startswith("all at once, ")
    _masked(text)
    wait_for(lambda: len(serve.rows(cid)) == 2, WAIT, "the reply stored")
    assert serve.rows(cid) == [("user", "hello"), ("assistant", text)]
