"""Attach through `recap serve` (``POST /v1/conversations/{name}/attach``), with the official
``openai`` client against a real serve process and the stand-in upstream: the next turn's
upstream request carries the source's messages between the markers, once; the client keeps
resending its own history (it never holds the markers) and every later turn stays on the branch
that holds the attachment, in chat completions and in the Responses API with
``previous_response_id``; another key's conversation is a 404, bad bodies a 400, and none of them
changes anything. The mapping of a resent history over the markers is also tested with plain
values (``prefix.longest_stored_prefix``, ``prefix.chain_ends``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from recap.core.request.prefix import chain_ends, longest_stored_prefix
from recap.core.storage.requests import resolve
from recap.workers.serve.auth import fingerprint
from tests.support.llm_server import LLMServer
from tests.support.serving import (
    KEY_A,
    KEY_B,
    MODEL,
    Serve,
    as_message,
    new_id,
    running_serve,
    turn,
)


@pytest.fixture(scope="module")
def serve(llm: LLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    folder = tmp_path_factory.mktemp("serve-attach")
    with running_serve(f"sqlite:///{folder / 'recap.db'}", folder, llm) as running:
        yield running


def attach(serve: Serve, name: str, body: Any, key: str = KEY_A) -> httpx.Response:
    return httpx.post(
        f"{serve.base_url}/conversations/{name}/attach",
        content=body if isinstance(body, bytes) else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        timeout=30,
    )


def sent(serve: Serve) -> list[str]:
    return [str(m.get("content")) for m in serve.llm.requests[-1].messages]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def stored_id(serve: Serve, name: str, key: str = KEY_A) -> str:
    return resolve(serve.engine, name, fingerprint(key)).conversation_id


def sub_agent(serve: Serve, key: str = KEY_A) -> str:
    name = new_id()
    turn(serve, name, [user("SUB: find the invoice total for ACME")], key=key)
    return name


def test_the_next_turn_carries_the_attached_conversation_and_later_turns_stay_on_it(
    serve: Serve,
) -> None:
    source = sub_agent(serve)
    name = new_id()
    history = [user("LEAD: what do we owe ACME?")]
    history.append(as_message(turn(serve, name, history).parse()))
    answer = attach(serve, name, {"source": source})
    assert answer.status_code == 200, answer.text
    made = answer.json()
    assert made["object"] == "recap.attachment" and made["source"] == source
    history.append(user("LEAD: so, the total?"))
    history.append(as_message(turn(serve, name, history).parse()))
    first = sent(serve)
    assert first.count("SUB: find the invoice total for ACME") == 1
    assert first.index("SUB: find the invoice total for ACME") < first.index("LEAD: so, the total?")
    history.append(user("LEAD: thanks"))
    turn(serve, name, history)
    later = sent(serve)
    assert later.count("SUB: find the invoice total for ACME") == 1  # still there, once
    assert later[-1] == "LEAD: thanks"
    rows = serve.rows(stored_id(serve, name))
    parents = {row[0]: row[1] for row in rows}
    by_text = {row[3]: row[0] for row in rows}
    thanks = by_text["LEAD: thanks"]
    chain = [thanks]
    while parents[chain[-1]] is not None:
        chain.append(parents[chain[-1]])
    assert made["close_message_id"] in chain  # one branch: the markers, then the new turns


def test_the_responses_api_continues_after_the_attachment(serve: Serve) -> None:
    source = sub_agent(serve)
    name = new_id()
    client = serve.client()
    headers = {"X-Recap-Conversation": name}
    first = client.responses.create(model=MODEL, input="LEAD: start", extra_headers=headers)
    assert attach(serve, name, {"source": source}).status_code == 200
    client.responses.create(
        model=MODEL,
        input="LEAD: go on",
        previous_response_id=first.id,
        extra_headers=headers,
    )
    assert sent(serve).count("SUB: find the invoice total for ACME") == 1
    assert sent(serve)[-1] == "LEAD: go on"


def test_another_keys_conversations_are_not_found_and_nothing_changes(serve: Serve) -> None:
    theirs = sub_agent(serve, key=KEY_B)
    name = new_id()
    turn(serve, name, [user("LEAD: hello")])
    before = serve.rows(stored_id(serve, name))
    refused = attach(serve, name, {"source": theirs})
    assert (
        refused.status_code == 404 and refused.json()["error"]["code"] == "conversation_not_found"
    )
    mine = sub_agent(serve)
    assert attach(serve, name, {"source": mine}, key=KEY_B).status_code == 404
    assert serve.rows(stored_id(serve, name)) == before


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{not json", 400, "JSON"),
        ({"source": ""}, 400, "'source'"),
        ({"source": 7}, 400, "'source'"),
        ({"source": "x", "leaf": "3"}, 400, "'leaf'"),
        ({"source": "x", "leaf": True}, 400, "'leaf'"),
        ({"source": "x", "leaf": 0}, 400, "'leaf'"),
        ({"source": "x", "extra": 1}, 400, "'extra'"),
        ({"source": "SELF"}, 400, "itself"),
        ({"source": "absent-source"}, 404, "absent-source"),
        ({"source": "SOURCE", "leaf": 999_999_999}, 404, "999999999"),
    ],
)
def test_bad_input_is_one_clear_error_and_changes_nothing(
    serve: Serve, body: Any, status: int, words: str
) -> None:
    source = sub_agent(serve)
    name = new_id()
    turn(serve, name, [user("LEAD: hello")])
    before = serve.rows(stored_id(serve, name))
    if isinstance(body, dict):
        body = {
            k: {"SELF": name, "SOURCE": source}.get(v, v) if isinstance(v, str) else v
            for k, v in body.items()
        }
    answer = attach(serve, name, body)
    assert answer.status_code == status, answer.text
    assert words in answer.json()["error"]["message"]
    assert serve.rows(stored_id(serve, name)) == before


def test_an_unknown_key_is_refused(serve: Serve) -> None:
    assert attach(serve, "anything", {"source": "x"}, key="sk-unknown").status_code == 401


# --- a resent history mapped over the markers (plain values) ----------------------------------


def test_chain_ends_follow_attachments_made_one_after_another() -> None:
    # (open, close, the open marker's parent)
    assert chain_ends([(3, 4, 2)]) == {2: 4}
    assert chain_ends([(3, 4, 2), (5, 6, 4)]) == {2: 6}
    assert chain_ends([(3, 4, 2), (7, 8, 6)]) == {2: 4, 6: 8}
    assert chain_ends([(3, 4, None)]) == {}
    assert chain_ends([]) == {}


# a tree: 1 (user a) -> 2 (assistant b) -> [3 open -> 4 close] -> 5 (user c) -> 6 (assistant d)
NODES = [(1, None, "a"), (2, 1, "b"), (5, 4, "c"), (6, 5, "d"), (9, 2, "x")]


@pytest.mark.parametrize(
    ("hashes", "bridges", "expected"),
    [
        (["a", "b", "c", "d"], {2: 4}, [1, 2, 5, 6]),  # over the markers
        (["a", "b", "c", "d"], {}, [1, 2]),  # without the bridge the walk stops at the markers
        (["a", "b", "x"], {2: 4}, [1, 2, 9]),  # a branch made before the attachment still maps
        (["a", "b"], {2: 4}, [1, 2]),
        (["c"], {2: 4}, []),  # the walk starts at a root
        ([], {2: 4}, []),
    ],
)
def test_longest_stored_prefix_walks_over_attachment_markers(
    hashes: list[str], bridges: dict[int, int], expected: list[int]
) -> None:
    assert longest_stored_prefix(NODES, hashes, [None], bridges) == expected


@pytest.mark.parametrize("seed", range(40))
def test_seeded_histories_map_over_any_attachments(seed: int) -> None:
    """A stored branch of client messages with attachments (one or several in a row) after
    random ones; the client resends any prefix of its messages, maybe with new ones: the path
    is exactly the stored ids of the prefix it repeats (the reference: the client's own
    messages, in order), never a marker, and the new messages' parent is the last marker after
    it."""
    import random

    rng = random.Random(seed)
    nodes: list[tuple[int, int | None, str | None]] = []
    markers: list[tuple[int, int, int | None]] = []
    client: list[tuple[int, str]] = []  # the client's messages: stored id, hash
    parent: int | None = None
    next_id = 1
    for n in range(rng.randint(1, 12)):
        digest = f"m{n}-{rng.randint(0, 2)}"  # repeated contents happen
        nodes.append((next_id, parent, digest))
        client.append((next_id, digest))
        parent, next_id = next_id, next_id + 1
        for _ in range(rng.choice([0, 0, 1, 2])):  # attachments after this message
            opened, closed = next_id, next_id + 1
            nodes += [(opened, parent, None), (closed, opened, None)]
            markers.append((opened, closed, parent))
            parent, next_id = closed, next_id + 2
    bridges = chain_ends(markers)
    marker_ids = {m for o, c, _ in markers for m in (o, c)}
    cut = rng.randint(0, len(client))
    hashes = [h for _, h in client[:cut]] + [f"new-{i}" for i in range(rng.randint(0, 2))]
    path = longest_stored_prefix(nodes, hashes, [None], bridges)
    assert path == [i for i, _ in client[:cut]]
    assert not marker_ids & set(path)
    if path:  # the reference: down the branch from the last repeated message over markers
        child_of = {parent_id: child for child, parent_id, _ in nodes}  # one branch
        lands = path[-1]
        while child_of.get(lands) in marker_ids:
            lands = child_of[lands]
        assert bridges.get(path[-1], path[-1]) == lands
