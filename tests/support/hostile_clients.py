"""Hostile and crowded clients of `recap serve`, shared by the suite and ``bench.serve_hostile``.

``first_turn_rounds`` sends, round after round, the first turn of a few new conversations from
many clients at once, spread over several serve processes, and counts what went wrong: errors,
forks (two children of one message) and duplicates (one message stored twice). ``request_bodies``
is a hypothesis strategy of chat-completions requests, valid and not (wrong types, unknown parts,
NaN, deep and odd JSON, conversation ids of any script); ``fuzz_once`` sends one and returns its
status.
"""

from __future__ import annotations

import json
import random
import threading
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from hypothesis import strategies as st
from sqlalchemy import Engine, select

from recap.core.storage.models import MESSAGES
from recap.core.storage.records import ROLES
from recap.workers.serve.headers import encode
from recap.workers.serve.upstream import PASSED_PARAMS

REQUEST_TIMEOUT = 120.0  # seconds one request may take (a crowded two-core machine)


@dataclass
class Outcome:
    """What the rounds saw."""

    turns: int = 0
    errors: list[str] = field(default_factory=list)
    forks: int = 0
    duplicates: int = 0


def _first_turn(base_url: str, key: str, model: str, cid: str, text: str) -> str | None:
    """One first turn; an error's description, or None when it was answered."""
    try:
        response = httpx.post(
            f"{base_url}/chat/completions",
            headers={"Authorization": f"Bearer {key}", "X-Recap-Conversation": cid},
            json={"model": model, "messages": [{"role": "user", "content": text}]},
            timeout=REQUEST_TIMEOUT,
        )
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    if response.status_code != 200:
        return f"{response.status_code}: {response.text[:200]}"
    return None


def first_turn_rounds(
    base_urls: Sequence[str],
    engine: Engine,
    *,
    key: str,
    model: str,
    rounds: int,
    clients: int = 16,
    conversations: int = 4,
    seed: int = 27,
) -> Outcome:
    """``rounds`` rounds of ``clients`` threads released at once, each sending the first turn
    of one of ``conversations`` new conversations to one of ``base_urls`` (shuffled, seeded),
    then the stored rows of every conversation checked."""
    rng = random.Random(seed)
    outcome = Outcome()
    for number in range(rounds):
        ids = [f"race-{number}-{i}-{uuid.uuid4().hex[:6]}" for i in range(conversations)]
        plan = [(base_urls[i % len(base_urls)], ids[i % conversations]) for i in range(clients)]
        rng.shuffle(plan)
        outcome.turns += clients
        outcome.errors += _at_once(plan, key, model)
        for cid in ids:
            forks, duplicates = _tree_faults(engine, cid)
            outcome.forks += forks
            outcome.duplicates += duplicates
    return outcome


def _at_once(plan: Sequence[tuple[str, str]], key: str, model: str) -> list[str]:
    """Every (serve URL, conversation) of ``plan`` sent by its own thread, released together;
    the errors."""
    barrier = threading.Barrier(len(plan))
    found: list[str | None] = [None] * len(plan)

    def client(slot: int, url: str, cid: str) -> None:
        barrier.wait()
        found[slot] = _first_turn(url, key, model, cid, f"first turn of {cid}")

    threads = [
        threading.Thread(target=client, args=(slot, url, cid))
        for slot, (url, cid) in enumerate(plan)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [error for error in found if error is not None]


def _tree_faults(engine: Engine, cid: str) -> tuple[int, int]:
    """Forks (messages beyond the first under one parent) and duplicates (a message stored
    again under the same parent) of one conversation; a first turn stores one user message
    and one reply under it."""
    m = MESSAGES.c
    with engine.connect() as connection:
        rows = connection.execute(
            select(m.parent_id, m.role, m.content_hash).where(m.conversation_id == cid)
        ).all()
    children = Counter(row[0] for row in rows)
    copies = Counter((row[0], row[1], row[2]) for row in rows)
    forks = sum(count - 1 for count in children.values())
    duplicates = sum(count - 1 for count in copies.values())
    return forks, duplicates


# --- the fuzz -----------------------------------------------------------------------------------

_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
json_values = st.recursive(
    _json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_part = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=30)}),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["image_url", "zzz", "input_audio", "file"])},
        optional={"image_url": json_values, "text": json_values},
    ),
    json_values,
)
_content = st.one_of(st.text(max_size=60), st.none(), st.lists(_part, max_size=3), json_values)
_call = st.fixed_dictionaries(
    {
        "id": st.one_of(st.text(min_size=1, max_size=10), json_values),
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": st.one_of(st.text(max_size=10), json_values)},
            optional={"arguments": st.one_of(st.just("{}"), json_values)},
        ),
    }
)
_message = st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(ROLES), st.text(max_size=8))},
    optional={
        "content": _content,
        "tool_calls": st.lists(_call, max_size=2),
        "tool_call_id": st.one_of(st.text(max_size=10), json_values),
        "name": st.one_of(st.text(max_size=10), json_values),
    },
)
_params = st.dictionaries(
    st.sampled_from(sorted(PASSED_PARAMS)), json_values, max_size=3
) | st.dictionaries(st.text(max_size=12), json_values, max_size=2)
_conversation = st.one_of(
    st.none(),
    st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=40),
    st.sampled_from(["chat-会话", "emoji-🙂", "a%20b", "%E4%BC%9A", "x" * 300]),
)


_text = st.text(st.characters(blacklist_categories=("Cs", "Co")), max_size=40)
_valid_message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": _text}),
    st.fixed_dictionaries(
        {
            "role": st.just("user"),
            "content": st.lists(
                st.fixed_dictionaries({"type": st.just("text"), "text": _text}),
                min_size=1,
                max_size=2,
            ),
        }
    ),
)
_valid_params = st.fixed_dictionaries(
    {},
    optional={
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0, 1),
        "max_tokens": st.integers(1, 4096),
        "seed": st.integers(-(2**63), 2**63 - 1),
        "stop": st.one_of(_text, st.lists(_text, max_size=2)),
        "user": _text,
        "n": st.just(1),
        "presence_penalty": st.floats(-2, 2),
    },
)


@st.composite
def request_bodies(draw: st.DrawFn, model: str) -> tuple[dict[str, Any], str | None]:
    """A chat-completions body and the conversation id to send as the header: half of them
    well-formed (text turns, typed parameters, either stream flag), half anything at all."""
    if draw(st.booleans()):
        messages: Any = draw(st.lists(_valid_message, min_size=1, max_size=4))
        messages[-1] = {"role": "user", "content": draw(_text) or "a question"}
        body: dict[str, Any] = {"model": model, "messages": messages, **draw(_valid_params)}
        body["stream"] = draw(st.booleans())
    else:
        messages = draw(
            st.one_of(
                st.lists(_message, min_size=1, max_size=4),
                st.just([{"role": "user", "content": "a plain question"}]),
                json_values,
            )
        )
        body = {"model": draw(st.one_of(st.just(model), json_values)), "messages": messages}
        body.update(draw(_params))
        if draw(st.booleans()):
            body["stream"] = draw(st.one_of(st.booleans(), json_values))
    named = draw(_conversation)
    if named is not None and draw(st.booleans()):
        body["metadata"] = {"recap_conversation": named}
        named = None
    elif draw(st.booleans()):
        body["metadata"] = draw(json_values)
    return body, named


def fuzz_once(base_url: str, key: str, body: dict[str, Any], header: str | None) -> int:
    """Send one fuzzed request (the body as Python's json writes it, NaN included); its
    status, the whole response read (a stream to its end)."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    if header is not None:  # blanks at either end cannot be written as they are: encoded
        headers["X-Recap-Conversation"] = encode(header) if header != header.strip() else header
    content = json.dumps(body).encode()
    with (
        httpx.Client(timeout=REQUEST_TIMEOUT) as client,
        client.stream(
            "POST", f"{base_url}/chat/completions", content=content, headers=_latin1(headers)
        ) as response,
    ):
        response.read()
        return response.status_code


def _latin1(headers: dict[str, str]) -> dict[bytes, bytes]:
    """Headers as the bytes a client writes: UTF-8 for any script (httpx takes bytes)."""
    return {name.encode(): value.encode("utf-8") for name, value in headers.items()}
