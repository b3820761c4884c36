"""Stored responses read back and deleted (``GET`` and ``DELETE /v1/responses/{id}``) by the key
that owns them, and every input item type the Open Responses specification lists either stored
or refused with a 400 naming it; on a real `recap serve` with the stand-in model, through the
official `openai` client where it has the call.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import httpx
import openai
import pytest
from sqlalchemy import Engine

from recap.core import service
from recap.core.errors import NotFoundError
from recap.core.settings import get_settings
from recap.core.storage import requests as history
from recap.core.storage import responses
from recap.core.storage.outputs import Ingest
from recap.workers.serve import responses_api
from tests.support import open_responses as spec
from tests.support.llm_server import LLMServer, Reply
from tests.support.serving import KEY_A, KEY_B, MODEL, Serve, running_serve

PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAE"
    "hQGAhKmMIQAAAABJRU5ErkJggg=="
)
ID_FUZZ_CASES = 60  # random ids sent to GET and DELETE
SHORT_ERROR = 400  # characters: an error about an id repeats little of it, whatever its size


@pytest.fixture(scope="module")
def serve(llm: LLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    folder = tmp_path_factory.mktemp("open-responses-store")
    with running_serve(f"sqlite:///{folder / 'recap.db'}", folder, llm) as running:
        yield running


def conversation_of(response_id: str) -> str:
    ref = responses_api.parse_response_id(response_id)
    assert ref is not None
    return ref.conversation_id


def raw(serve: Serve, method: str, response_id: str, key: str = KEY_A) -> httpx.Response:
    url = f"{serve.base_url}/responses/{quote(response_id, safe='')}"
    return httpx.request(method, url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def assert_openai_error(answer: httpx.Response, status: int) -> None:
    """An error in OpenAI's shape, with a short message."""
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert len(error["message"]) <= SHORT_ERROR


# --- GET /v1/responses/{id} -----------------------------------------------------------------


def test_retrieve_gives_back_the_stored_response(serve: Serve) -> None:
    """The response read back has the id, output and usage it was answered with, valid
    against the schema."""
    client = serve.client()
    made = client.responses.create(model=MODEL, input="keep me " + random.choice("abc"))
    got = client.responses.retrieve(made.id)
    assert (got.id, got.status, got.output_text) == (made.id, "completed", made.output_text)
    assert got.usage == made.usage and got.store is True
    assert [i.id for i in got.output] == [i.id for i in made.output]
    assert spec.response_errors(raw(serve, "GET", made.id).json()) == []


def test_retrieve_a_streamed_response_and_its_tool_calls(serve: Serve) -> None:
    """A streamed response (its id given before its reply was stored) and a reply of tool
    calls read back as they were streamed."""
    call = {"id": "call_s1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    serve.llm.script(Reply(text="", tool_calls=[call]))
    client = serve.client()
    tools = [{"type": "function", "name": "ls", "parameters": {"type": "object"}}]
    with client.responses.stream(model=MODEL, input="stream a call", tools=tools) as stream:
        final = stream.get_final_response()
    got = client.responses.retrieve(final.id)
    assert got.id == final.id
    assert [(i.type, getattr(i, "call_id", None)) for i in got.output] == [
        ("function_call", "call_s1")
    ]
    assert [i.id for i in got.output] == [i.id for i in final.output]


def test_retrieve_as_a_stream(serve: Serve) -> None:
    """``stream=true`` on a retrieve: the stored reply as the events of a stream, each valid,
    ending in the same response a whole retrieve gives."""
    call = {"id": "call_r1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    serve.llm.script(Reply(text="looking", reasoning="hm", tool_calls=[call]))
    client = serve.client()
    made = client.responses.create(model=MODEL, input="replay me")
    events = list(client.responses.retrieve(made.id, stream=True))
    whole = raw(serve, "GET", made.id).json()
    for event in events:
        assert spec.event_errors(event.model_dump(mode="json", exclude_unset=True)) == []
    assert events[-1].type == "response.completed"
    final = events[-1].response.model_dump(mode="json", exclude_unset=True)
    assert final == whole
    assert [item["type"] for item in whole["output"]] == ["reasoning", "message", "function_call"]


def test_another_key_sees_nothing(serve: Serve) -> None:
    """Another key's GET and DELETE are the 404 of an id never given; the owner's response
    is untouched."""
    made = serve.client().responses.create(model=MODEL, input="mine alone")
    other = serve.client(KEY_B)
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(made.id)
    assert_openai_error(raw(serve, "GET", made.id, KEY_B), 404)
    assert raw(serve, "GET", "resp_never", KEY_B).json() == raw(serve, "GET", "resp_never").json()
    assert serve.client().responses.retrieve(made.id).id == made.id


def test_ids_that_name_nothing(serve: Serve) -> None:
    """An id Recap did not give, one of ``store: false``, one naming a user message and an
    oversized one: short errors in OpenAI's shape (404, 404, 404, 400); no key is a 401."""
    client = serve.client()
    loose = client.responses.create(model=MODEL, input="nothing kept", store=False)
    made = client.responses.create(model=MODEL, input="a question")
    cid = conversation_of(made.id)
    user_id = next(row[0] for row in serve.rows(cid) if row[2] == "user")
    forged = responses_api.response_id(cid, user_id, exact=True)
    for value in ("resp_abc", "nope", loose.id, forged):
        assert_openai_error(raw(serve, "GET", value), 404)
        assert_openai_error(raw(serve, "DELETE", value), 404)
    assert_openai_error(raw(serve, "GET", "resp_" + "A" * 5000), 400)
    answer = httpx.get(f"{serve.base_url}/responses/{made.id}", timeout=30)
    assert_openai_error(answer, 401)


def test_random_ids_get_a_json_error(serve: Serve) -> None:
    """Seeded random ids (any characters, any length, some shaped like Recap's): always a
    JSON error in OpenAI's shape, 400 or 404, never a server error."""
    rng = random.Random(7)
    alphabet = string.printable + "éß漢\u200b/%?#"
    for case in range(ID_FUZZ_CASES):
        size = rng.choice([1, 8, 40, 300, 2000])
        value = "".join(rng.choice(alphabet) for _ in range(size))
        if case % 3 == 0:
            value = responses_api.response_id(value, rng.randint(0, 10**19), exact=case % 2 == 0)
        for method in ("GET", "DELETE"):
            answer = raw(serve, method, value)
            assert answer.status_code in (400, 404), (value, answer.text)
            assert_openai_error(answer, answer.status_code)


# --- DELETE /v1/responses/{id} --------------------------------------------------------------


def test_delete_then_the_id_names_nothing(serve: Serve) -> None:
    """DELETE answers as OpenAI does; then the id reads, continues and deletes as one never
    given, and the conversation's history is as it was."""
    client = serve.client()
    made = client.responses.create(model=MODEL, input="delete me")
    cid = conversation_of(made.id)
    stored = serve.count(cid)
    answer = raw(serve, "DELETE", made.id)
    assert answer.status_code == 200
    assert answer.json() == {"id": made.id, "object": "response.deleted", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError) as refused:
        client.responses.create(model=MODEL, input="more", previous_response_id=made.id)
    assert refused.value.code == "previous_response_not_found"
    assert_openai_error(raw(serve, "DELETE", made.id), 404)
    assert serve.count(cid) == stored


def test_delete_with_the_official_client(serve: Serve) -> None:
    """`client.responses.delete` of a streamed response (its id names the reply stored after
    the request)."""
    client = serve.client()
    with client.responses.stream(model=MODEL, input="stream then delete") as stream:
        final = stream.get_final_response()
    client.responses.delete(final.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(final.id)


# --- every input item type ------------------------------------------------------------------

CALL_ID = "call_items_1"
ACCEPTED: list[dict[str, Any]] = [
    {"type": "message", "role": "system", "content": "system words"},
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
    {
        "id": "msg_in_1",
        "type": "message",
        "role": "user",
        "status": "completed",
        "content": [
            {"type": "input_text", "text": "user words"},
            {"type": "input_image", "image_url": PNG, "detail": "low"},
        ],
    },
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking words"}]},
    {
        "type": "message",
        "role": "assistant",
        "phase": "commentary",
        "content": [
            {"type": "output_text", "text": "assistant words", "annotations": []},
            {"type": "refusal", "refusal": " refusal words"},
        ],
    },
    {"type": "function_call", "call_id": CALL_ID, "name": "ls", "arguments": '{"d": "."}'},
    {
        "type": "function_call_output",
        "call_id": CALL_ID,
        "output": [{"type": "input_text", "text": "tool words"}],
    },
    {"type": "reasoning", "summary": [], "encrypted_content": "opaque"},
    {"type": "message", "role": "user", "content": "last words"},
]
REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"type": "item_reference", "id": "msg_1"}, "item_reference"),
    ({"id": "msg_1"}, "item_reference"),
    ({"type": "compaction", "encrypted_content": "opaque"}, "compaction"),
    (
        {
            "type": "function_call_output",
            "call_id": "call_x",
            "output": [{"type": "input_image", "image_url": PNG}],
        },
        "input_image",
    ),
    (
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_file", "file_url": "https://example.com/a.pdf"}],
        },
        "input_file",
    ),
]


def test_the_item_tables_are_the_specifications() -> None:
    """Every item in the tables is a valid input item of the specification, and together
    they cover every item type it lists."""
    item_param = spec.component("ItemParam")
    for item in [*ACCEPTED, *(item for item, _ in REFUSED)]:
        assert spec.errors(item_param, item) == [], item
    listed = spec.document()["components"]["schemas"]["ItemParam"]["oneOf"]
    assert len(listed) == 9  # reference, reasoning, compaction, 4 messages, call, call output
    covered = {responses_api.item_type(i) for i in [*ACCEPTED, *(i for i, _ in REFUSED)]}
    assert covered == {
        "item_reference", "reasoning", "compaction", "message", "function_call",
        "function_call_output",
    }  # fmt: skip
    roles = {i.get("role") for i in ACCEPTED if i.get("type") == "message"}
    assert roles == {"system", "developer", "user", "assistant"}


def test_accepted_items_are_stored(serve: Serve) -> None:
    """One request holding every accepted item type: each is stored in the conversation."""
    made = serve.client().responses.create(model=MODEL, input=ACCEPTED)  # type: ignore[arg-type]
    branch = serve.branch(conversation_of(made.id))
    stored = json.dumps(branch)
    for words in ("user words", "assistant words", "refusal words", "tool words", "last words"):
        assert words in stored
    assistant = next(m for m in branch if m["role"] == "assistant" and m.get("tool_calls"))
    assert assistant["tool_calls"][0]["id"] == CALL_ID
    assert assistant["reasoning_content"] == "thinking words"
    assert any(m["role"] == "tool" and m["tool_call_id"] == CALL_ID for m in branch)
    user = next(m for m in branch if m["role"] == "user")
    assert any(p.get("type") == "image_url" for p in user["content"])


@pytest.mark.parametrize(("item", "named"), REFUSED, ids=[n for _, n in REFUSED])
def test_refused_items_name_their_type(serve: Serve, item: dict[str, Any], named: str) -> None:
    """An item Recap cannot carry is a 400 naming its type, and nothing is stored."""
    before: list[dict[str, Any]] = [{"role": "user", "content": "first"}]
    if item.get("type") == "function_call_output":  # the call it answers, so only it is wrong
        call = {"type": "function_call", "call_id": item["call_id"], "name": "f", "arguments": ""}
        before.append(call)
    body = {"model": MODEL, "input": [*before, item]}
    answer = httpx.post(
        f"{serve.base_url}/responses",
        json=body,
        headers={"Authorization": f"Bearer {KEY_A}"},
        timeout=30,
    )
    assert_openai_error(answer, 400)
    assert named in answer.json()["error"]["message"]


# --- the storage under it, on SQLite and PostgreSQL -----------------------------------------

DELETERS = 6  # threads deleting responses of one conversation at once


def test_deletes_at_once_are_all_kept(engine: Engine) -> None:
    """Responses of one conversation deleted by several threads at once: every one is recorded
    (the list is rewritten under the conversation's lock), each reads back as gone, the others'
    conversation is untouched, and the messages are all still there."""
    ingest = Ingest.from_settings(get_settings())
    owner = history.Owner("owner-fingerprint", "gpt-4o-mini", None)
    cid, replies = "conv-deletes", []
    messages: list[dict[str, Any]] = []
    for turn in range(DELETERS):
        messages.append({"role": "user", "content": f"question {turn}"})
        mapped = history.store_request(engine, ingest, cid, owner, messages)
        reply = {"role": "assistant", "content": f"answer {turn}"}
        replies.append(history.store_reply(engine, ingest, cid, owner, mapped.leaf_id, reply))
        messages.append(reply)
    first = responses.stored_reply(engine, cid, replies[0], exact=True, owner=owner.fingerprint)
    assert first.message == {"role": "assistant", "content": "answer 0"}
    with pytest.raises(NotFoundError):  # another owner
        history.forget_response(engine, cid, replies[0], "someone-else")
    with ThreadPoolExecutor(DELETERS) as pool:
        list(pool.map(lambda r: history.forget_response(engine, cid, r, owner.fingerprint),
                      replies))  # fmt: skip
    for reply_id in replies:
        with pytest.raises(NotFoundError):
            responses.stored_reply(engine, cid, reply_id, exact=True, owner=owner.fingerprint)
        with pytest.raises(NotFoundError):
            history.forget_response(engine, cid, reply_id, owner.fingerprint)
    assert len(service.export_conversation(engine, cid)["messages"]) == 2 * DELETERS
