"""`recap serve` sets OpenAI's caching hints on the upstream request of a stored turn: the
conversation's ``prompt_cache_key`` (per branch) and RECAP_PROMPT_CACHE_RETENTION, unless the
client set its own, on chat completions and on the Responses API, through both upstream paths
(direct and litellm); driven by the official `openai` package against a real serve process and
the stand-in upstream.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from recap.core.settings import Settings
from recap.core.storage.requests import scoped_id
from recap.core.values.assembly import prompt_cache_key
from recap.workers.serve import responses_api
from recap.workers.serve.auth import fingerprint
from recap.workers.serve.upstream import Upstream
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

RETENTION = "in_memory"


@pytest.fixture(scope="module")
def serve(llm: LLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    folder = tmp_path_factory.mktemp("serve-cache-key")
    db_url = f"sqlite:///{folder / 'recap.db'}"
    with running_serve(db_url, folder, llm, RECAP_PROMPT_CACHE_RETENTION=RETENTION) as running:
        yield running


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def sent(serve: Serve, before: int) -> dict[str, Any]:
    """The body of the upstream request made since ``before`` requests."""
    assert len(serve.llm.requests) == before + 1
    return serve.llm.requests[before].body


def expected_key(serve: Serve, stored_id: str) -> str:
    """The key of a conversation's main line: of its stored id and its first message."""
    return prompt_cache_key(stored_id, serve.rows(stored_id)[0][0])


def test_chat_turns_carry_the_conversations_key(either: Serve) -> None:
    """Each turn of a conversation goes upstream with its key (and, on the process with the
    setting, the retention); another conversation's key differs; a turn without a conversation
    is passed through as the client sent it."""
    cid, other = new_id(), new_id()
    before = len(either.llm.requests)
    first = turn(either, cid, [user("one")])
    key = sent(either, before)["prompt_cache_key"]
    assert key == expected_key(either, cid)
    before = len(either.llm.requests)
    turn(either, cid, [user("one"), as_message(first.parse()), user("two")])
    assert sent(either, before)["prompt_cache_key"] == key
    before = len(either.llm.requests)
    turn(either, other, [user("one")])
    assert sent(either, before)["prompt_cache_key"] not in (None, key)
    before = len(either.llm.requests)
    turn(either, None, [user("one")])
    assert "prompt_cache_key" not in sent(either, before)
    if either.path == "direct":  # the module's own serve, started with the setting
        before = len(either.llm.requests)
        turn(either, cid, [user("one"), as_message(first.parse()), user("three")])
        assert sent(either, before)["prompt_cache_retention"] == RETENTION


def test_a_clients_own_hints_win(either: Serve) -> None:
    """A client's ``prompt_cache_key`` and retention are sent as it set them."""
    before = len(either.llm.requests)
    turn(
        either,
        new_id(),
        [user("mine")],
        prompt_cache_key="client-key",
        prompt_cache_retention="24h",
    )
    body = sent(either, before)
    assert (body["prompt_cache_key"], body["prompt_cache_retention"]) == ("client-key", "24h")


def test_an_edit_goes_out_under_its_branchs_key(serve: Serve) -> None:
    """The client edits its last message: the branch it starts has a key of its own."""
    cid = new_id()
    first = turn(serve, cid, [user("one")])
    history = [user("one"), as_message(first.parse())]
    before = len(serve.llm.requests)
    turn(serve, cid, [*history, user("two")])
    main = sent(serve, before)["prompt_cache_key"]
    before = len(serve.llm.requests)
    turn(serve, cid, [*history, user("two, edited")])
    assert sent(serve, before)["prompt_cache_key"] not in (None, main)


def test_another_keys_conversation_of_the_same_name_has_another_key(serve: Serve) -> None:
    """Two client keys on one name: two stored conversations, two cache keys."""
    cid = new_id()
    before = len(serve.llm.requests)
    turn(serve, cid, [user("same")])
    turn(serve, cid, [user("same")], key=KEY_B)
    a, b = (r.body["prompt_cache_key"] for r in serve.llm.requests[before:])
    assert a == expected_key(serve, cid)
    assert b == expected_key(serve, scoped_id(cid, fingerprint(KEY_B))) != a


def test_responses_turns_carry_the_key_and_keep_the_clients(either: Serve) -> None:
    """The Responses API: a stored response goes upstream with its conversation's key, the
    continuation with the same one; a client's own key is sent as it set it."""
    client = either.client(KEY_A)
    before = len(either.llm.requests)
    first = client.responses.create(model=MODEL, input="first")
    key = sent(either, before)["prompt_cache_key"]
    ref = responses_api.parse_response_id(first.id)
    assert ref is not None and key == expected_key(either, ref.conversation_id)
    before = len(either.llm.requests)
    client.responses.create(model=MODEL, input="second", previous_response_id=first.id)
    assert sent(either, before)["prompt_cache_key"] == key
    before = len(either.llm.requests)
    client.responses.create(model=MODEL, input="mine", prompt_cache_key="client-key")
    assert sent(either, before)["prompt_cache_key"] == "client-key"


@pytest.mark.parametrize(
    ("model", "mode", "takes"),
    [
        ("openai/gpt-4o-mini", "auto", True),
        ("gpt-4o-mini", "litellm", True),
        ("azure/my-deployment", "litellm", True),
        ("anthropic/claude-3-5-sonnet-latest", "litellm", False),
        ("gemini/gemini-1.5-pro", "litellm", False),
        ("no-such-provider/x", "litellm", False),
        ("anthropic/claude-3-5-sonnet-latest", "direct", True),  # direct: OpenAI format
    ],
)
def test_only_openai_family_models_get_the_hints(model: str, mode: str, takes: bool) -> None:
    """Hints go to OpenAI-family models (a client's own as well); another provider gets
    none, not even a client's."""
    settings = Settings(
        upstream_api_base="http://127.0.0.1:9/v1",
        upstream_client=mode,
    )
    upstream = Upstream(settings)
    hints = {"prompt_cache_key": "recap-k", "prompt_cache_retention": "24h"}
    params = upstream.with_cache_hints(model, {"temperature": 0, "prompt_cache_key": "own"}, hints)
    if takes:
        assert params == {
            "temperature": 0,
            "prompt_cache_key": "own",
            "prompt_cache_retention": "24h",
        }
    else:
        assert params == {"temperature": 0}


def test_a_hint_of_the_wrong_type_is_a_400(serve: Serve) -> None:
    """A key that is not a string: an OpenAI-style 400 naming it; nothing goes upstream."""
    before = len(serve.llm.requests)
    response = serve.client(KEY_A).chat.completions.with_raw_response
    with pytest.raises(Exception) as raised:
        response.create(
            model=MODEL,
            messages=[user("x")],  # type: ignore[list-item]
            extra_headers={"X-Recap-Conversation": new_id()},
            extra_body={"prompt_cache_key": 7},
        )
    assert getattr(raised.value, "status_code", None) == 400
    assert "prompt_cache_key" in str(raised.value)
    assert len(serve.llm.requests) == before
