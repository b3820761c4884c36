"""Provider compaction (``RECAP_PROVIDER_COMPACTION=auto``): a real `recap serve` on the native
Responses dialect and a real Celery worker (in this process, on the file broker), against the
stand-in upstream that speaks the Responses API and its ``/responses/compact`` endpoint and
validates what it is sent (``tests.support.native_upstream``), driven by the official openai
client.

The worker's run stores the provider's compaction item beside Recap's readable summary of the
same cutoff; the next request to the same model carries the item byte for byte in place of the
summary's text, a request to another model the readable summary (the item reported left out);
a compaction that fails (HTTP 500, a reply without a compaction item, a timeout) leaves the
readable summary in place and loses no turn.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from celery.contrib.testing.worker import start_worker
from sqlalchemy import inspect, select, text
from starlette.testclient import TestClient

from recap.core.client import Recap
from recap.core.compression import provider
from recap.core.request.native_anthropic import anthropic_input
from recap.core.request.native_items import SUMMARY_ITEMS_KEY, Report, provider_item
from recap.core.request.native_openai import responses_input
from recap.core.settings import Settings, get_settings
from recap.core.storage.migrate import alembic_config, current_revision, upgrade
from recap.core.storage.models import MESSAGES, SUMMARIES, CompactionLog, table_of
from recap.core.summaries.prompts import SUMMARY_MESSAGE_PREFIX
from recap.workers import metrics
from recap.workers.app import app
from recap.workers.ui.app import standalone
from tests.support.celery_helpers import configured_app
from tests.support.cli_helpers import recap
from tests.support.native_upstream import COMPACT_BETA, Running, compacted_host_run, dumps
from tests.support.processes import WaitTimeout, wait_for
from tests.support.serving import Serve, running_serve

MODEL_A, MODEL_B = "openai/stand-a", "openai/stand-b"
WINDOW = 3_000  # a few long turns go over the trigger
WORDS = 110
TURNS = 14
QUIET_TURNS = 5  # turns under the trigger whatever the tokenizer
RUN_SECONDS = 4.0  # a turn over the trigger waits this long for the worker's summary
LOG = table_of(CompactionLog)
UI_KEY = "console-operator-key"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Serve, Running]]:
    """Serve on the native dialect with provider compaction on, its worker, the stand-in."""
    folder = tmp_path_factory.mktemp("provider-compaction")
    url = f"sqlite:///{folder / 'recap.db'}"
    upstream = Running()
    env = {
        "RECAP_DATABASE_URL": url,
        "RECAP_SERVE_MAX_INPUT_TOKENS": str(WINDOW),
        "RECAP_BROKER_URL": "filesystem://",
        "RECAP_BROKER_FOLDER": str(folder / "serve" / "broker"),
        "RECAP_UPSTREAM_API_BASE": upstream.url,
        "RECAP_UPSTREAM_API_KEY": "sk-upstream-secret-0123456789abcdef",
        "RECAP_UPSTREAM_DIALECT": "native",
        "RECAP_PROVIDER_COMPACTION": "auto",
        "RECAP_ACTIVATION_HORIZON_REQUESTS": "0",  # a ready summary is used at once
        "RECAP_LLM_TIMEOUT": "1.5",  # under the stand-in's slow compaction
    }
    monkeypatch = pytest.MonkeyPatch()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("RECAP_SUMMARY_MODEL", raising=False)  # the extractive summary
    get_settings.cache_clear()
    try:
        with (
            running_serve(url, folder / "serve", upstream, **env) as serve,  # type: ignore[arg-type]
            configured_app(get_settings(), None),
            start_worker(app, pool="threads", concurrency=1, perform_ping_check=False,
                         loglevel="WARNING", shutdown_timeout=30),
        ):  # fmt: skip
            yield serve, upstream
    finally:
        upstream.stop()
        monkeypatch.undo()
        get_settings.cache_clear()


def conversation_of(serve: Serve, tag: str) -> str:
    with serve.engine.connect() as connection:
        statement = select(MESSAGES.c.conversation_id).where(MESSAGES.c.content.like(f"%{tag}%"))
        return str(connection.execute(statement).scalars().first())


def summaries(serve: Serve, cid: str) -> list[tuple[int, str | None]]:
    with serve.engine.connect() as connection:
        c = SUMMARIES.c
        statement = select(c.cutoff_message_id, c.provider_items).where(c.conversation_id == cid)
        return [(int(a), b) for a, b in connection.execute(statement)]


def reasons(serve: Serve, cid: str) -> list[str]:
    with serve.engine.connect() as connection:
        statement = select(LOG.c.reason).where(LOG.c.conversation_id == cid)
        return [str(r) for r in connection.execute(statement).scalars()]


def chat_until_summarized(serve: Serve, tag: str) -> tuple[str, str, int]:
    """Long turns for MODEL_A until the worker has written a summary: the conversation id,
    the last response id, and the number of turns sent."""
    client = serve.client()
    previous: str | None = None
    cid = ""
    for n in range(TURNS):
        words = " ".join(f"{tag}{n}w{i}" for i in range(WORDS))
        reply = client.responses.create(
            model=MODEL_A, input=f"turn {n} of {tag}: {words}", previous_response_id=previous
        )
        previous = reply.id
        cid = cid or conversation_of(serve, tag)
        if n < QUIET_TURNS:  # under the trigger: no run to wait for
            continue
        try:  # over the trigger, the run is enqueued: the worker answers within seconds
            wait_for(partial(summaries, serve, cid), RUN_SECONDS, "a summary")
        except WaitTimeout:
            continue
        return cid, previous, n + 1
    raise AssertionError(f"no summary was written: {reasons(serve, cid)}")


def failures_counted() -> float:
    sample = metrics.registry.get_sample_value(
        "recap_worker_provider_compactions_total", {"outcome": "failed"}
    )
    return float(sample or 0)


def console_page(cid: str) -> str:
    """The conversation's console page, logged in with the operator's key."""
    os.environ["RECAP_UI_KEYS"] = UI_KEY
    get_settings.cache_clear()
    try:
        http = TestClient(standalone(), base_url="http://127.0.0.1")
        login = http.post("/ui/login", data={"key": UI_KEY}, follow_redirects=False)
        assert login.status_code == 303
        return http.get(f"/ui/c/{cid}").text
    finally:
        del os.environ["RECAP_UI_KEYS"]
        get_settings.cache_clear()


def next_request(
    serve: Serve, upstream: Running, model: str, previous: str, text: str
) -> tuple[str, dict[str, str]]:
    """One more turn: the upstream request's raw text and the reply's headers."""
    before = len(upstream.state.requests)
    raw = serve.client().responses.with_raw_response.create(
        model=model, input=text, previous_response_id=previous
    )
    raw.parse()
    sent = [r for r in upstream.state.requests[before:] if r.path.endswith("/responses")]
    assert sent and sent[-1].status == 200, [r.error for r in sent]
    return sent[-1].raw.decode(), dict(raw.headers)


def test_the_run_stores_both_and_each_model_gets_its_own(stack: tuple[Serve, Running]) -> None:
    serve, upstream = stack
    upstream.state.compaction_failure = ""
    cid, previous, turns = chat_until_summarized(serve, "alpha")
    [(cutoff, stored)] = summaries(serve, cid)
    assert stored is not None, reasons(serve, cid)
    items = json.loads(stored)
    compaction = next(i for i in items if i["type"] == "compaction")
    assert compaction["provider"] == "openai" and compaction["model"] == MODEL_A
    made = [r for r in upstream.state.requests if r.path.endswith("/responses/compact")]
    assert made and made[-1].status == 200
    assert compaction["raw"] in made[-1].raw.decode() or compaction["raw"] in dumps(
        json.loads(compaction["raw"])
    )
    # the same model: the provider's item in place of the summary's text, byte for byte
    same, headers = next_request(serve, upstream, MODEL_A, previous, "and now? alpha-next")
    assert compaction["raw"] in same
    assert SUMMARY_MESSAGE_PREFIX.strip()[:30] not in same
    assert int(headers["x-recap-provider-items-sent"]) >= 1
    # another model: the readable summary, the item left out and reported
    other, headers = next_request(serve, upstream, MODEL_B, previous, "and for b? alpha-b")
    assert compaction["raw"] not in other
    assert json.loads(compaction["raw"])["encrypted_content"] not in other
    assert SUMMARY_MESSAGE_PREFIX.strip()[:30] in json.loads(other)["input"][0]["content"]
    assert int(headers["x-recap-provider-items-left-out"]) >= 1
    assert cutoff > 0 and turns >= 2
    # `recap summaries` and the console show both
    listed = recap("summaries", cid, "--json")
    assert listed.code == 0, listed.stderr
    [row] = json.loads(listed.stdout)["summaries"]
    assert row["provider_compaction"] == f"{MODEL_A} (openai): {len(items)} items"
    assert row["tokens"] > 0
    page = console_page(cid)
    assert 'data-testid="summary-text"' in page and 'data-testid="summary-provider"' in page
    assert html.escape(compaction["raw"], quote=True) in page or "encrypted_content" in page
    assert [r.error for r in upstream.state.refused if r.path.endswith("/responses")] == []


@pytest.mark.parametrize("failure", ["http", "shape", "slow"])
def test_a_failed_compaction_leaves_the_readable_summary(
    stack: tuple[Serve, Running], failure: str
) -> None:
    serve, upstream = stack
    upstream.state.compaction_failure = failure
    counted = failures_counted()
    try:
        tag = f"fail{failure}"
        cid, previous, turns = chat_until_summarized(serve, tag)
    finally:
        upstream.state.compaction_failure = ""
    [(_cutoff, stored)] = summaries(serve, cid)
    assert stored is None
    assert any("provider compaction failed" in r for r in reasons(serve, cid))
    assert failures_counted() == counted + 1  # the worker's metric
    [row] = json.loads(recap("summaries", cid, "--json").stdout)["summaries"]
    assert row["provider_compaction"] == ""
    sent, _headers = next_request(serve, upstream, MODEL_A, previous, f"after {tag}")
    body = json.loads(sent)
    assert SUMMARY_MESSAGE_PREFIX.strip()[:30] in body["input"][0]["content"]
    assert '"type":"compaction"' not in sent
    # no turn lost: every turn after the cutoff is still sent, the newest last
    assert f"turn {turns - 1} of {tag}" in sent and body["input"][-1]["content"] == f"after {tag}"


# --- the pieces, without serve ----------------------------------------------------------------


def test_a_compaction_item_changed_by_one_byte_is_refused(stack: tuple[Serve, Running]) -> None:
    _serve, upstream = stack
    client = openai.OpenAI(base_url=upstream.url, api_key="k", max_retries=0)
    compacted = client.responses.compact(
        model="stand-a",
        input=[{"role": "user", "content": "hello"}],  # type: ignore[list-item]
    )
    assert compacted.object == "response.compaction"
    item = compacted.output[-1].model_dump(exclude_none=True)
    assert item["type"] == "compaction"
    later = [item, {"role": "user", "content": "go on"}]
    assert client.responses.create(model="stand-a", input=later).output  # type: ignore[arg-type]
    changed = dict(item)
    text = item["encrypted_content"]
    changed["encrypted_content"] = text[:3] + ("A" if text[3] != "A" else "B") + text[4:]
    with pytest.raises(openai.BadRequestError, match="invalid_encrypted_content"):
        client.responses.create(model="stand-a", input=[changed, later[1]])  # type: ignore[list-item]
    with pytest.raises(openai.BadRequestError, match="invalid_encrypted_content"):
        client.responses.create(model="stand-b", input=later)  # type: ignore[arg-type]


def test_anthropic_compaction_through_the_stand_in(stack: tuple[Serve, Running]) -> None:
    """The Messages form: the beta and the edit asked for, the compaction block stored, sent
    back in an assistant turn to the same model (accepted) and refused when changed."""
    _serve, upstream = stack
    settings = Settings(upstream_api_base=upstream.url, provider_compaction="auto", llm_timeout=5)  # type: ignore[call-arg]
    model = "anthropic/claude-stand-a"
    assert provider.dialect(settings, model) == provider.MESSAGES
    span = [{"role": "user", "content": "a long story"}, {"role": "assistant", "content": "ok"}]
    items = provider.compact(settings, provider.MESSAGES, model, span, 5.0)
    asked = upstream.state.requests[-1]
    assert asked.status == 200
    assert asked.body["context_management"]["edits"][0]["type"] == "compact_20260112"
    assert [i["type"] for i in items] == ["compaction"]
    summary = {"role": "user", "content": "readable", SUMMARY_ITEMS_KEY: items}
    messages = [summary, {"role": "user", "content": "next question"}]
    report = Report()
    _system, turns = anthropic_input(messages, model, report)
    assert report.sent == 1 and turns[1]["role"] == "assistant"
    claude_body = {"model": "claude-stand-a", "max_tokens": 50, "messages": turns}
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": COMPACT_BETA}
    base = upstream.url.removesuffix("/v1")
    assert httpx.post(f"{base}/v1/messages", json=claude_body, headers=headers).status_code == 200
    block = dict(turns[1]["content"][0])
    block["content"] = block["content"] + "!"
    turns[1]["content"][0] = block
    refused = httpx.post(f"{base}/v1/messages", json=claude_body, headers=headers)
    assert refused.status_code == 400 and "compaction" in refused.text
    turns[1]["content"][0] = json.loads(items[0]["raw"])  # as stored again
    assert httpx.post(f"{base}/v1/messages", json=claude_body, headers=headers).status_code == 200
    elsewhere_body = {**claude_body, "model": "claude-stand-b"}
    refused = httpx.post(f"{base}/v1/messages", json=elsewhere_body, headers=headers)
    assert refused.status_code == 400  # another model's block
    # another model: the readable text, the block counted as left out
    other = Report()
    _system, elsewhere = anthropic_input(messages, "anthropic/claude-stand-b", other)
    assert other.left_out == 1 and "compaction" not in json.dumps(elsewhere)


def test_no_compaction_asked_when_off_or_without_an_upstream() -> None:
    on = Settings(upstream_api_base="http://127.0.0.1:9/v1", provider_compaction="auto")  # type: ignore[call-arg]
    assert provider.dialect(on, MODEL_A) == provider.RESPONSES
    off = Settings(upstream_api_base="http://x/v1", provider_compaction="off")  # type: ignore[call-arg]
    assert provider.dialect(off, MODEL_A) is None
    alone = Settings(upstream_api_base=None, provider_compaction="auto")  # type: ignore[call-arg]
    assert provider.dialect(alone, MODEL_A) is None
    assert provider.dialect(on, "mistral/other") is None
    assert provider.dialect(on, "gpt-5") == provider.RESPONSES
    with pytest.raises(provider.CompactionFailed):  # nothing listens there
        provider.compact(on, provider.RESPONSES, MODEL_A, [{"role": "user", "content": "x"}], 1)


def test_bad_shapes_are_refused() -> None:
    for reply in ([], {"output": "x"}, {"output": [{"type": "message"}]}, {"output": [1]}):
        with pytest.raises(provider.CompactionFailed):
            provider.items_from(provider.RESPONSES, reply, MODEL_A)
    no_content = {"output": [{"type": "compaction", "encrypted_content": ""}]}
    with pytest.raises(provider.CompactionFailed):
        provider.items_from(provider.RESPONSES, no_content, MODEL_A)


def test_responses_input_puts_the_items_in_place_of_the_summary() -> None:
    item: dict[str, Any] = {"type": "compaction", "id": "c1", "encrypted_content": "e.f"}
    stored = [provider_item("openai", MODEL_A, item, 0, kind="compaction")]
    summary = {"role": "user", "content": "readable", SUMMARY_ITEMS_KEY: stored}
    report = Report()
    _i, items = responses_input([summary, {"role": "user", "content": "q"}], MODEL_A, report)
    assert items[0] == item and report.sent == 1
    other = Report()
    _i, items = responses_input([summary], MODEL_B, other)
    assert items[0]["content"] == "readable" and other.left_out == 1


def test_settings_read_the_option(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RECAP_PROVIDER_COMPACTION", "auto")
    assert Settings().provider_compaction == "auto"  # type: ignore[call-arg]
    monkeypatch.setenv("RECAP_PROVIDER_COMPACTION", "sometimes")
    with pytest.raises(ValueError):
        Settings()  # type: ignore[call-arg]


@pytest.mark.parametrize("mode", ["", "http", "shape"])
def test_the_python_api_keeps_both_and_falls_back(
    stack: tuple[Serve, Running], tmp_path: Path, mode: str
) -> None:
    """A host on the Python API: ``Recap.compress`` stores both forms (or the readable one
    alone when the provider's compaction fails); ``recap.native.responses_input`` sends the
    provider's items to the same model, the readable summary to another; the upstream accepts
    both."""
    _serve, upstream = stack
    run = compacted_host_run(upstream.state, upstream.url, str(tmp_path), mode)
    assert run["action"] == "summarized"
    summary = run["summary"]
    assert summary.tokens > 0
    status_a, report_a, sent_a = run["sent"][MODEL_A]
    status_b, report_b, sent_b = run["sent"][MODEL_B]
    assert status_a == status_b == 200
    assert "what now?" in sent_a and "what now?" in sent_b  # no turn lost
    if mode:
        assert summary.provider_compaction == ""
        assert '"type":"compaction"' not in sent_a and report_a.sent == 0
    else:
        assert summary.provider_compaction.startswith(f"{MODEL_A} (openai)")
        assert '"type":"compaction"' in sent_a and report_a.sent >= 1
        assert report_b.left_out >= 1
    assert '"type":"compaction"' not in sent_b
    assert SUMMARY_MESSAGE_PREFIX.strip()[:30] in sent_b


def compacting_host(upstream: Running, folder: Path) -> Recap:
    """A host whose runs ask the stand-in for the provider's compaction (no summary model of
    its own: the chat's), each summary active at once."""
    settings = Settings(  # type: ignore[call-arg]
        database_url=f"sqlite:///{folder}/recap.db",
        upstream_api_base=upstream.url,
        provider_compaction="auto",
        summary_model=None,
        activation_horizon_requests=0,
    )
    return Recap(settings, create_schema=True)


def test_a_second_compaction_carries_the_first(
    stack: tuple[Serve, Running], tmp_path: Path
) -> None:
    """The span of a later run starts with the summary before it: the provider is sent its
    own earlier compaction (byte for byte, accepted), not the readable text."""
    _serve, upstream = stack
    host = compacting_host(upstream, tmp_path)
    cid = host.new(model=MODEL_A, max_input_tokens=3_000)
    stored: list[str] = []
    for round_ in range(2):
        for n in range(8):
            words = " ".join(f"r{round_}t{n}w{i}" for i in range(110))
            host.add(cid, {"role": "user", "content": f"turn {n}: {words}"})
            host.add(cid, {"role": "assistant", "content": f"noted {n}"})
        host.add(cid, {"role": "user", "content": f"round {round_} done?"})
        before = len(upstream.state.requests)
        assert host.compress(cid, force=True).action == "summarized"
        [asked] = [r for r in upstream.state.requests[before:] if r.path.endswith("/compact")]
        assert asked.status == 200, asked.error
        with host.engine.connect() as connection:
            statement = select(SUMMARIES.c.provider_items).where(SUMMARIES.c.conversation_id == cid)
            stored = [
                str(v) for v in connection.execute(statement.order_by(SUMMARIES.c.id)).scalars()
            ]
        if round_ == 1:
            first = next(i for i in json.loads(stored[0]) if i["type"] == "compaction")
            assert first["raw"] in asked.raw.decode()
            assert SUMMARY_MESSAGE_PREFIX.strip()[:30] not in asked.raw.decode()
    assert len(stored) == 2 and all(stored)
    host.engine.dispose()


@pytest.mark.parametrize(
    "database", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_migration_0019_adds_the_column_in_place(
    database: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """summaries.provider_items added and dropped in place: the rows survive both ways, and
    an erased summary's id is never handed out again (SQLite keeps the table's AUTOINCREMENT)."""
    from alembic import command

    url = (
        request.getfixturevalue("postgres_url")
        if database == "postgres"
        else f"sqlite:///{tmp_path / 'm.db'}"
    )
    host = Recap(Settings(database_url=url), create_schema=True)  # type: ignore[call-arg]
    host.new("c", model="gpt-4o", max_input_tokens=1_000)
    engine = host.engine
    insert = text(
        "INSERT INTO summaries (conversation_id, cutoff_message_id, text, tokens, encoding, "
        "model, input_tokens, output_tokens, identifier_retention, created_at, pending, "
        "provider_items) VALUES ('c', :cutoff, 's', 1, 'o200k_base', 'm', 0, 0, 1.0, "
        "'2026-01-01 00:00:00', false, :items)"
    )
    with engine.begin() as connection:
        connection.execute(insert, {"cutoff": 1, "items": None})
        connection.execute(insert, {"cutoff": 2, "items": "[]"})
        connection.execute(text("DELETE FROM summaries WHERE cutoff_message_id = 2"))
    command.downgrade(alembic_config(engine), "0018")
    assert current_revision(engine) == "0018"
    with engine.connect() as connection:
        columns = {c["name"] for c in inspect(connection).get_columns("summaries")}
        assert "provider_items" not in columns
        assert connection.execute(text("SELECT id FROM summaries")).scalars().all() == [1]
    upgrade(engine)
    with engine.begin() as connection:
        connection.execute(insert, {"cutoff": 3, "items": "[]"})
        ids = connection.execute(text("SELECT id FROM summaries ORDER BY id")).scalars().all()
    assert ids == [1, 3]
    engine.dispose()


def test_anthropic_compaction_through_the_python_api(
    stack: tuple[Serve, Running], tmp_path: Path
) -> None:
    """A Claude conversation whose span reaches Anthropic's minimum trigger: the run asks with
    the beta and the edit, stores the signed block beside the summary; the next request for the
    same model (the official anthropic client) carries it in an assistant turn and is accepted,
    another model's gets the readable summary. A span under the trigger is not asked."""
    import anthropic

    from recap import native

    _serve, upstream = stack
    claude_a, claude_b = "anthropic/claude-stand-a", "anthropic/claude-stand-b"
    host = compacting_host(upstream, tmp_path)
    small = host.new(model=claude_a, max_input_tokens=3_000)
    for n in range(8):
        host.add(small, {"role": "user", "content": " ".join(f"s{n}w{i}" for i in range(110))})
        host.add(small, {"role": "assistant", "content": f"noted {n}"})
    before = len(upstream.state.requests)
    assert host.compress(small, force=True).action == "summarized"
    assert len(upstream.state.requests) == before  # under the trigger: not asked
    cid = host.new(model=claude_a, max_input_tokens=200_000)
    words = [f"alpha{n} beta{n} gamma{n} delta{n}" for n in range(2_000)]
    for n in range(30):
        host.add(cid, {"role": "user", "content": f"part {n}: " + " ".join(words)})
        host.add(cid, {"role": "assistant", "content": f"read part {n}"})
    host.add(cid, {"role": "user", "content": "and the answer?"})
    before = len(upstream.state.requests)
    assert host.compress(cid, force=True).action == "summarized"
    [asked] = upstream.state.requests[before:]
    assert asked.status == 200 and asked.path.endswith("/v1/messages")
    assert asked.body["context_management"]["edits"][0]["pause_after_compaction"] is True
    [row] = host.summaries(cid)
    assert row.provider_compaction == f"{claude_a} (anthropic): 1 item"
    claude = anthropic.Anthropic(
        base_url=upstream.url.removesuffix("/v1"), api_key="k", max_retries=0
    )
    for model, carried in ((claude_a, True), (claude_b, False)):
        assembled = host.assemble(cid, model=model, max_input_tokens=200_000)
        report = native.Report()
        _system, turns = native.anthropic_input(assembled.messages, model, report)
        reply = claude.messages.create(
            model=model.removeprefix("anthropic/"),
            max_tokens=100,
            messages=turns,  # type: ignore[arg-type]
            extra_headers={"anthropic-beta": COMPACT_BETA},
        )
        assert reply.content
        sent = upstream.state.requests[-1]
        assert sent.status == 200 and ('"type":"compaction"' in sent.raw.decode()) == carried
        assert (report.sent, report.left_out) == ((1, 0) if carried else (0, 1))
        assert turns[-1]["content"][-1]["text"] == "and the answer?"
    host.engine.dispose()


def test_chat_completions_never_carry_the_items() -> None:
    """The chat-completions path sends the summary's text alone (it has no compaction item):
    the items and the left-out count stay out of what goes upstream; a text-only request
    neither carries nor counts them."""
    from recap.core.request.assembly.parts import summary_part
    from recap.core.values.records import SummaryRec
    from recap.workers.serve.upstream import outgoing

    item = {"type": "compaction", "id": "c1", "encrypted_content": "e" * 400}
    stored = dumps([provider_item("openai", MODEL_A, item, 0, kind="compaction")])
    summary = SummaryRec(
        id=1,
        cutoff_message_id=5,
        previous_summary_id=None,
        text="what happened",
        tokens=10,
        provider_items=stored,
    )
    same, same_tokens = summary_part(summary, "o200k_base", MODEL_A)
    other, other_tokens = summary_part(summary, "o200k_base", MODEL_B)
    plain, plain_tokens = summary_part(summary, "o200k_base", MODEL_A, text_only=True)
    assert same is not None and other is not None and plain is not None
    assert SUMMARY_ITEMS_KEY in same and same_tokens > other_tokens == plain_tokens
    assert other["provider_items_left_out"] == 1 and SUMMARY_ITEMS_KEY not in other
    assert set(plain) == {"role", "content"}
    for message in (same, other):
        [sent] = outgoing([message])
        assert set(sent) == {"role", "content"} and sent["content"] == message["content"]


def test_an_unexpected_error_in_the_compaction_keeps_the_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not only the provider's failures: any error while asking (here the span's conversion)
    leaves the run summarized with the readable summary, the error in its reason."""

    def broken(*_args: Any) -> Any:
        raise RuntimeError("conversion broke")

    monkeypatch.setattr(provider, "span_messages", broken)
    settings = Settings(  # type: ignore[call-arg]
        database_url=f"sqlite:///{tmp_path}/recap.db",
        upstream_api_base="http://127.0.0.1:9/v1",
        provider_compaction="auto",
        summary_model=None,
    )
    host = Recap(settings, create_schema=True)
    cid = host.new(model=MODEL_A, max_input_tokens=3_000)
    for n in range(8):
        host.add(cid, {"role": "user", "content": " ".join(f"u{n}w{i}" for i in range(110))})
        host.add(cid, {"role": "assistant", "content": f"noted {n}"})
    result = host.compress(cid, force=True)
    assert result.action == "summarized"
    assert "provider compaction failed" in result.reason and "conversion broke" in result.reason
    [row] = host.summaries(cid)
    assert row.provider_compaction == "" and row.tokens > 0
    host.engine.dispose()
