"""`recap serve` across client keys and across turns in quick succession, driven by the official
`openai` and `anthropic` packages against a real serve process and the stand-in upstream:

- conversation ids are scoped per key (another key's `user-42` is a conversation of its own, in
  every API), and the key is checked before any lock, so one key's stalled turn never delays
  another's;
- a response id (or the end of a stream) is usable the moment the client sees it;
- a client gone mid-stream stops serve reading the upstream.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from sqlalchemy import Engine
from sqlmodel import Session

from recap.core.errors import NotFoundError
from recap.core.storage import store
from recap.core.storage.requests import resolve, scoped_id
from tests.support.llm_server import LLMServer, Reply
from tests.support.serving import (
    KEY_A,
    KEY_B,
    MODEL,
    Serve,
    as_message,
    new_id,
    running_serve,
    turn,
    wait_until,
)
from recap.workers.serve import responses_api
from recap.workers.serve.auth import fingerprint

PROMPT_SECONDS = 3.0  # another key's request answers within this while one key's is stalled
ROUNDS = 100  # stream-then-continue rounds per API
PARALLEL = 4  # conversations running their rounds at once
BIG_REPLY_WORDS = 3_000  # words of the large fast reply
BIG_WORD = "x" * 10_000  # ... each this long: a 30 MB stream, far past any socket buffer
PACE = 0.001  # seconds between its chunks: fast, yet a reader gone is seen long before the end


@pytest.fixture(scope="module")
def serve(llm: LLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    folder = tmp_path_factory.mktemp("serve-tenancy")
    with running_serve(f"sqlite:///{folder / 'recap.db'}", folder, llm) as running:
        yield running


def anthropic_client(serve: Serve, key: str, cid: str | None = None) -> anthropic.Anthropic:
    headers = {"X-Recap-Conversation": cid} if cid else None
    return anthropic.Anthropic(
        base_url=serve.base_url.removesuffix("/v1"),
        api_key=key,
        max_retries=0,
        timeout=60,
        default_headers=headers,
    )


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def sent_texts(recorded: Any) -> list[str]:
    """The contents of the non-system messages an upstream request carried."""
    return [str(m.get("content")) for m in recorded.messages if m.get("role") != "system"]


# --- where a key's name is stored (a table of plain cases) -------------------------------------

A, B = fingerprint(KEY_A), fingerprint(KEY_B)
LIBRARY = None  # a conversation created by the library or the CLI: nobody's


@pytest.mark.parametrize(
    ("plain", "scoped", "stored", "exists"),
    [
        ("absent", "absent", "name", False),  # a free name is taken as it is
        (A, "absent", "name", True),  # this key's own, as before the scoping
        (B, "absent", "scoped", False),  # another key's: a conversation of its own
        (LIBRARY, "absent", "scoped", False),
        (B, A, "scoped", True),
        (A, A, "name", True),
        ("absent", A, "scoped", True),  # the other key's deleted since: still the scoped one
        ("absent", B, "error", False),  # a scoped id another key made: never this key's
    ],
)
def test_resolve_names(
    sqlite_engine: Engine, plain: str | None, scoped: str | None, stored: str, exists: bool
) -> None:
    """Where key A's conversation ``name`` is stored, for each state of the name and of A's
    scoped id."""
    name = new_id()
    with Session(sqlite_engine) as session:
        for cid, owner in ((name, plain), (scoped_id(name, A), scoped)):
            if owner != "absent":
                store.ensure_conversation(session, cid, MODEL, 8_000, owner=owner)
        session.commit()
    if stored == "error":
        with pytest.raises(NotFoundError):
            resolve(sqlite_engine, name, A)
        return
    found = resolve(sqlite_engine, name, A)
    assert found.conversation_id == (name if stored == "name" else scoped_id(name, A))
    assert found.exists is exists


def test_scoped_ids_fit_and_differ() -> None:
    """A scoped id fits the id column for any name, and differs by key and by whole name."""
    long = "n" * 255
    assert len(scoped_id(long, A)) == 255 and scoped_id(long, A).startswith("n" * 200)
    assert scoped_id(long, A) != scoped_id(long, B)
    assert scoped_id(long, A) != scoped_id(long[:-1] + "m", A)
    assert scoped_id("user-42", A).startswith("user-42~")


# --- ownership before any lock -----------------------------------------------------------------


def test_a_stalled_stream_never_delays_another_keys_request(serve: Serve) -> None:
    """Key A's stream on a name is stalled upstream; key B's request naming the same
    conversation answers at once (its own conversation), in every API."""
    cid = new_id()
    before = len(serve.llm.requests)
    serve.llm.script(Reply(hold=True))
    errors: list[BaseException] = []

    def stalled() -> None:
        try:
            stream = serve.client(KEY_A).chat.completions.create(
                model=MODEL,
                messages=[user("stall here")],
                stream=True,
                extra_headers={"X-Recap-Conversation": cid},
            )
            for _ in stream:
                pass
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=stalled)
    thread.start()
    try:
        assert serve.llm.wait_for(before + 1), "key A's request never reached the upstream"
        calls = [
            lambda: turn(serve, cid, [user("mine, not A's")], key=KEY_B),
            lambda: serve.client(KEY_B).responses.create(
                model=MODEL, input="mine too", extra_headers={"X-Recap-Conversation": cid}
            ),
            lambda: anthropic_client(serve, KEY_B, cid).messages.create(
                model=MODEL, max_tokens=50, messages=[user("and mine")]
            ),
        ]
        for call in calls:
            started = time.monotonic()
            call()
            assert time.monotonic() - started < PROMPT_SECONDS
    finally:
        serve.llm.release()
        thread.join(timeout=60)
    assert not errors
    assert serve.count(cid) == 2  # A's turn, stored once its upstream answered


# --- ids scoped per key ------------------------------------------------------------------------


def test_another_keys_name_is_a_conversation_of_its_own(serve: Serve) -> None:
    """A creates `user-…`; B's first turn on it is a 200 like a fresh id's, stored under B's
    scoped id; each key then continues only its own history."""
    cid = new_id()
    a = turn(serve, cid, [user("A's secret plan")])
    b = turn(serve, cid, [user("B's question")], key=KEY_B)
    fresh = turn(serve, new_id(), [user("B's question")], key=KEY_B)
    assert a.http_response.status_code == b.http_response.status_code == 200
    assert b.headers["x-recap-conversation"] == cid  # the name it gave, as for a fresh id
    assert fresh.http_response.status_code == 200
    assert serve.count(cid) == 2  # A's, untouched
    b_stored = scoped_id(cid, fingerprint(KEY_B))
    assert serve.count(b_stored) == 2
    assert resolve(serve.engine, cid, fingerprint(KEY_B)).conversation_id == b_stored
    assert resolve(serve.engine, cid, fingerprint(KEY_A)).conversation_id == cid
    before = len(serve.llm.requests)
    history_b = [user("B's question"), as_message(b.parse()), user("B again")]
    turn(serve, cid, history_b, key=KEY_B)
    assert sent_texts(serve.llm.requests[before]) == [str(m["content"]) for m in history_b]
    history_a = [user("A's secret plan"), as_message(a.parse()), user("A again")]
    turn(serve, cid, history_a)
    assert "B's question" not in serve.llm.requests[before + 1].text
    assert serve.count(cid) == 4 and serve.count(b_stored) == 4


def test_scoped_ids_in_the_responses_and_messages_apis(serve: Serve) -> None:
    """Responses (header and previous_response_id), Messages and count_tokens: B naming A's
    conversation gets its own, and what A's holds never shows."""
    cid = new_id()
    a_first = serve.client(KEY_A).responses.create(
        model=MODEL, input="A's own words", extra_headers={"X-Recap-Conversation": cid}
    )
    b_first = serve.client(KEY_B).responses.create(
        model=MODEL, input="B's words", extra_headers={"X-Recap-Conversation": cid}
    )
    ref = responses_api.parse_response_id(b_first.id)
    assert ref is not None and ref.conversation_id == cid  # the name, never the stored id
    before = len(serve.llm.requests)
    serve.client(KEY_B).responses.create(
        model=MODEL, input="B goes on", previous_response_id=b_first.id
    )
    assert "A's own words" not in serve.llm.requests[before].text
    assert "B's words" in serve.llm.requests[before].text
    with pytest.raises(openai.NotFoundError):  # A's id names nothing for B
        serve.client(KEY_B).responses.create(
            model=MODEL, input="x", previous_response_id=a_first.id
        )
    serve.client(KEY_A).responses.create(
        model=MODEL, input="A goes on", previous_response_id=a_first.id
    )
    assert "B's words" not in serve.llm.requests[-1].text
    b_stored = scoped_id(cid, fingerprint(KEY_B))
    assert serve.count(cid) == 4 and serve.count(b_stored) == 4

    name = new_id()
    a_reply = anthropic_client(serve, KEY_A, name).messages.create(
        model=MODEL, max_tokens=50, messages=[user("A's anthropic words")]
    )
    assert a_reply.content
    b_client = anthropic_client(serve, KEY_B, name)
    asked = [user("A's anthropic words")]  # what B would send to probe A's conversation
    probe = b_client.messages.count_tokens(model=MODEL, messages=asked).input_tokens
    fresh = anthropic_client(serve, KEY_B, new_id()).messages.count_tokens(
        model=MODEL, messages=asked
    )
    assert probe == fresh.input_tokens  # no trace of A's stored conversation
    b_client.messages.create(model=MODEL, max_tokens=50, messages=[user("B's anthropic")])
    assert serve.count(name) == 2 and serve.count(scoped_id(name, fingerprint(KEY_B))) == 2


def test_seeded_turns_of_two_keys_on_shared_names(serve: Serve) -> None:
    """Random turns of two keys over three shared names, through chat completions and the
    Messages API: every upstream request carries exactly that key's history of that name."""
    rng = random.Random(36)
    names = [new_id() for _ in range(3)]
    histories: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for step in range(30):
        key, name = rng.choice((KEY_A, KEY_B)), rng.choice(names)
        history = histories.setdefault((key, name), [])
        history.append(user(f"step {step} by {key[-4:]} on {name}"))
        before = len(serve.llm.requests)
        if rng.random() < 0.5:
            reply = turn(serve, name, history, key=key).parse()
            text = reply.choices[0].message.content
        else:
            message = anthropic_client(serve, key, name).messages.create(
                model=MODEL, max_tokens=60, messages=history
            )
            text = message.content[0].text
        assert sent_texts(serve.llm.requests[before]) == [m["content"] for m in history]
        history.append({"role": "assistant", "content": text})
    for (key, name), history in histories.items():
        stored = resolve(serve.engine, name, fingerprint(key)).conversation_id
        assert [m["content"] for m in serve.branch(stored)] == [m["content"] for m in history]


# --- a response id is usable the moment the client sees it -------------------------------------


def test_responses_stream_then_continue_at_once(serve: Serve) -> None:
    """A streamed Responses turn read to `response.completed`, then at once a turn continuing
    from its id: never a 404 (it was about 2 in 100), ROUNDS times over, in a few
    conversations at once (as a busy server runs them)."""
    failures: list[str] = []

    def rounds(worker: int) -> None:
        client = serve.client(KEY_A)
        previous: str | None = None
        for index in range(ROUNDS // PARALLEL):
            completed = ""
            with client.responses.stream(
                model=MODEL, input=f"w{worker} round {index}", previous_response_id=previous
            ) as stream:
                for event in stream:
                    if event.type == "response.completed":  # acted on at once, as clients do
                        completed = event.response.id
                        break
            try:
                answer = client.responses.create(
                    model=MODEL, input=f"w{worker} after {index}", previous_response_id=completed
                )
            except openai.NotFoundError as exc:
                failures.append(str(exc))
                previous = None
                continue
            previous = answer.id

    threads = [threading.Thread(target=rounds, args=(n,)) for n in range(PARALLEL)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert failures == []


def test_chat_and_messages_stream_then_continue_at_once(serve: Serve) -> None:
    """A streamed turn read to its end, then at once the next turn resending the whole
    history, ROUNDS times in each API: one linear branch, every message stored once."""
    cid = new_id()
    client = serve.client(KEY_A)
    history: list[dict[str, Any]] = []
    for index in range(ROUNDS // 2):
        history.append(user(f"chat round {index}"))
        stream = client.chat.completions.create(
            model=MODEL, messages=history, stream=True, extra_headers={"X-Recap-Conversation": cid}
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        history.append({"role": "assistant", "content": text})
    rows = serve.rows(cid)
    assert len(rows) == len(history)
    assert all(row[1] == previous[0] for row, previous in zip(rows[1:], rows, strict=False))

    name = new_id()
    anthropic_history: list[dict[str, Any]] = []
    ac = anthropic_client(serve, KEY_A, name)
    for index in range(ROUNDS // 2):
        anthropic_history.append(user(f"messages round {index}"))
        with ac.messages.stream(model=MODEL, max_tokens=60, messages=anthropic_history) as s:
            final = s.get_final_message()
        anthropic_history.append({"role": "assistant", "content": final.content[0].text})
    rows = serve.rows(name)
    assert len(rows) == len(anthropic_history)
    assert all(row[1] == previous[0] for row, previous in zip(rows[1:], rows, strict=False))


# --- errors that echo what the client sent -----------------------------------------------------


def test_a_long_bad_response_id_is_not_echoed_whole(serve: Serve) -> None:
    """A 5,000-character previous_response_id: a 404 whose message holds a short piece of it."""
    value = "resp_" + "Q" * 5_000
    with pytest.raises(openai.NotFoundError) as caught:
        serve.client(KEY_A).responses.create(model=MODEL, input="x", previous_response_id=value)
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["code"] == "previous_response_not_found"
    assert len(json.dumps(body)) < 400


# --- a client gone stops the upstream read -----------------------------------------------------


def test_a_client_gone_stops_reading_the_upstream(either: Serve) -> None:
    """A large, fast streamed reply; the client reads a little and closes: the stand-in
    upstream sees its connection closed before it wrote the whole body (on both paths)."""
    serve = either
    text = " ".join([BIG_WORD] * BIG_REPLY_WORDS)
    streamed = len(serve.llm.streamed)
    serve.llm.script(Reply(text=text))
    with (
        httpx.Client(timeout=60) as client,
        client.stream(
            "POST",
            f"{serve.base_url}/chat/completions",
            headers={"Authorization": f"Bearer {KEY_A}", "X-Recap-Conversation": new_id()},
            json={"model": MODEL, "messages": [user("a huge answer")], "stream": True},
        ) as response,
    ):
        assert response.status_code == 200
        next(response.iter_bytes())
    gone = time.monotonic()
    wait_until(lambda: len(serve.llm.streamed) > streamed, "the upstream's stream to end")
    written, whole, ended = serve.llm.streamed[streamed]
    assert written < whole, (
        f"the upstream wrote all {whole} bytes, the last {ended - gone:.2f} s after the client left"
    )


def test_retrieve_and_delete_find_a_keys_response_under_its_scoped_id(serve: Serve) -> None:
    """GET and DELETE /v1/responses/{id} for B's response on a name A had first: B's reply (not
    A's), A's id a 404 for B, and B's delete leaves A's response as it was."""
    cid = new_id()
    a_first = serve.client(KEY_A).responses.create(
        model=MODEL, input="A asks", extra_headers={"X-Recap-Conversation": cid}
    )
    b_first = serve.client(KEY_B).responses.create(
        model=MODEL, input="B asks", extra_headers={"X-Recap-Conversation": cid}
    )
    got = serve.client(KEY_B).responses.retrieve(b_first.id)
    assert got.id == b_first.id and got.output_text == b_first.output_text
    with pytest.raises(openai.NotFoundError):
        serve.client(KEY_B).responses.retrieve(a_first.id)
    with pytest.raises(openai.NotFoundError):
        serve.client(KEY_B).responses.delete(a_first.id)
    serve.client(KEY_B).responses.delete(b_first.id)
    with pytest.raises(openai.NotFoundError):
        serve.client(KEY_B).responses.retrieve(b_first.id)
    assert serve.client(KEY_A).responses.retrieve(a_first.id).output_text == a_first.output_text
