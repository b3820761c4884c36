"""Hostile input through the host API, the pieces behind the CLI's checks, and file modes.

The same messages the CLI refuses are refused by ``Recap.add``, ``Recap.add_many`` and the import
(one ``InputError``, nothing stored); what providers do accept still goes in. The size limit, the
broker URL check and the bounded reader are tables of plain values. Every file and folder Recap
creates (the SQLite database and its ``-wal``/``-shm``, ``.recap/``, the broker's folders and
messages, the saved outputs) is 0600/0700 under an ordinary 022 umask.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from recap.core import service
from recap.core.client import Recap
from recap.core.errors import BudgetError, InputError
from recap.core.inputs import read_bytes, read_text
from recap.core.request import shape
from recap.core.settings import (
    BROKER_SCHEMES,
    RESULT_BACKENDS,
    SettingsError,
    api_base_problem,
    broker_url_problem,
    load_settings,
    result_backend_problem,
)
from recap.core.values.records import ROLES
from tests.support.cli_helpers import recap, recap_process, snapshot

CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
USER = {"role": "user", "content": "hi"}
IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}

REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("user-null", {"role": "user", "content": None}, "content is missing"),
    ("user-missing", {"role": "user"}, "content is missing"),
    ("developer-null", {"role": "developer", "content": None}, "content is missing"),
    ("assistant-null", {"role": "assistant", "content": None}, "content is missing"),
    ("assistant-no-calls", {"role": "assistant", "tool_calls": []}, "content is missing"),
    ("numbers", {"role": "user", "content": [1, 2]}, "part 0: a content part must be an object"),
    ("unknown-part", {"role": "user", "content": [{"type": "zzz"}]}, "'zzz'"),
    ("part-type-number", {"role": "user", "content": [{"type": 3}]}, "string type"),
    ("text-missing", {"role": "user", "content": [{"type": "text"}]}, "string 'text'"),
    ("refusal-number", {"role": "user", "content": [{"type": "refusal", "refusal": 1}]}, "refusal"),
    ("empty-parts", {"role": "user", "content": []}, "empty list"),
    ("object", {"role": "user", "content": {"weird": 1}}, "not an object"),
    ("boolean", {"role": "user", "content": True}, "not a boolean"),
    ("id-true", {**USER, "id": True}, "id must be a string, not a boolean (true)"),
    ("id-float", {**USER, "id": 1.5}, "id must be a string, not a number"),
    ("id-list", {**USER, "id": ["x"]}, "id must be a string"),
    ("nan", {**USER, "temperature": math.nan}, "finite"),
    ("inf-nested", {**USER, "metadata": {"scores": [1.0, math.inf]}}, "finite"),
    ("role-number", {"role": 1, "content": "x"}, "unknown role"),
]

ACCEPTED: list[tuple[str, list[dict[str, Any]]]] = [
    ("tool-call-null-content", [{"role": "assistant", "content": None, "tool_calls": [CALL]}]),
    ("tool-call-no-content", [{"role": "assistant", "tool_calls": [CALL]}]),
    ("refusal", [{"role": "assistant", "content": None, "refusal": "I cannot help with that."}]),
    ("empty-string", [{"role": "assistant", "content": ""}]),
    ("text-parts", [{"role": "user", "content": [{"type": "text", "text": "hi"}, IMAGE]}]),
    (
        "thinking",
        [
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {"type": "text", "text": "done"},
                ],
            }
        ],
    ),
    ("id-string", [{**USER, "id": "m-1"}]),
    ("id-integer", [{**USER, "id": 7}]),  # what `recap export` writes
    ("big-integer", [{**USER, "seed": 2**70}]),
]


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Recap]:
    """A host on a fresh SQLite file with conversation ``c`` (one user message)."""
    settings = load_settings(
        database_url=f"sqlite:///{tmp_path / 'recap.db'}", output_dir=tmp_path / "outputs"
    )
    client = Recap(settings, create_schema=True)
    client.new("c")
    client.add("c", {"role": "user", "content": "Read the README, please. " * 20})
    yield client


@pytest.mark.parametrize(
    ("message", "fragment"), [(m, f) for _, m, f in REFUSED], ids=[n for n, _, _ in REFUSED]
)
def test_the_host_api_refuses_what_no_provider_accepts(
    host: Recap, tmp_path: Path, message: dict[str, Any], fragment: str
) -> None:
    """``add``, ``add_many`` (after a good message) and an import: one ``InputError`` each,
    naming the problem, and the database unchanged."""
    before = snapshot(host.engine, tmp_path)
    with pytest.raises(InputError, match=_escaped(fragment)):
        host.add("c", message)
    with pytest.raises(InputError, match=_escaped(fragment)):
        host.add_many("c", [USER, message])
    record = {"id": "n", "messages": [USER, message]}
    with pytest.raises(InputError, match=_escaped(fragment)):
        service.import_conversations(host.engine, [record], host.settings)
    assert snapshot(host.engine, tmp_path) == before


@pytest.mark.parametrize(("messages"), [m for _, m in ACCEPTED], ids=[n for n, _ in ACCEPTED])
def test_what_providers_accept_still_goes_in(host: Recap, messages: list[dict[str, Any]]) -> None:
    """Null content beside tool calls or a refusal, parts of every known type, string and
    integer message ids: stored, and an assemble afterwards works."""
    ids = host.add_many("c", messages)
    assert len(ids) == len(messages)
    host.assemble("c")


@pytest.mark.parametrize("cid", [True, 5, 1.5, ["x"], {"a": 1}])
def test_an_imported_conversation_id_is_a_string(tmp_path: Path, cid: Any) -> None:
    """``"id": true`` no longer imports as ``"True"``: any id that is not a string is refused on
    the line that holds it."""
    line = json.dumps({"id": cid, "messages": [USER]})
    path = tmp_path / "one.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(InputError, match=r"one\.jsonl line 1: 'id' must be a string"):
        service.read_import_file(path)


def test_an_export_imports_again_as_it_is(host: Recap, tmp_path: Path) -> None:
    """``recap export`` writes integer message ids; the import takes them (and stores its own)."""
    host.add_many("c", [{"role": "assistant", "content": None, "tool_calls": [CALL]}])
    host.add("c", {"role": "tool", "tool_call_id": "call_1", "content": "ok"})
    exported = host.export("c").as_dict()
    exported["id"] = "again"
    path = tmp_path / "export.jsonl"
    path.write_text(json.dumps(exported) + "\n")
    imported = service.import_conversations(
        host.engine, service.read_import_file(path), host.settings
    )
    assert imported == [("again", 3)]


def test_a_failed_assemble_records_no_profile(host: Recap, tmp_path: Path) -> None:
    """A request that does not fit records nothing, from the host API too; one that fits records
    the parts it was given."""
    before = snapshot(host.engine, tmp_path)
    with pytest.raises(BudgetError):
        host.assemble("c", system="Be brief.", max_input_tokens=40)
    assert snapshot(host.engine, tmp_path) == before
    host.assemble("c", system="Be brief.")
    with host.engine.connect() as connection:
        rows = connection.execute(text("select system_tokens from request_profiles")).all()
    assert len(rows) == 1 and rows[0][0] > 0


def test_the_shape_module_knows_the_storage_roles() -> None:
    """``core.request.shape`` (no storage import) and the stored records agree on the roles."""
    assert shape.ROLES == ROLES


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"a": [1.0, {"b": math.nan}]}, "finite"),
        ([math.inf], "finite"),
        ({"a": [[[[1]]]]}, None),
        ([], None),
    ],
)
def test_check_numbers(value: Any, problem: str | None) -> None:
    """Every number in a forwarded value is finite, at any position."""
    if problem is None:
        shape.check_numbers(value, "body")
    else:
        with pytest.raises(InputError, match=problem):
            shape.check_numbers(value, "body")


def test_check_numbers_bounds_the_depth() -> None:
    """A value nested past the limit is refused, never walked for ever (a cycle included)."""
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(InputError, match="nested deeper"):
        shape.check_numbers(cycle, "body")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("filesystem://", None),
        ("memory://", None),
        ("redis://127.0.0.1:6379/0", None),
        ("rediss://host:6380/0", None),
        ("redis+socket:///tmp/redis.sock", None),
        ("sentinel://host:26379", None),
        ("amqp://guest@localhost//", None),
        ("pyamqp://guest@localhost//", None),
        ("sqs://", None),  # a kombu transport Recap does not test: kombu's to make work
        ("redis://a:6379/0;redis://b:6379/0", None),
        ("bogus://x", "'bogus'"),
        ("redis://a;nope://b", "'nope'"),
        ("redis", "no scheme"),
        ("", "no scheme"),
        ("://host", "no scheme"),
        ("user:secret@host", "no scheme"),
    ],
)
def test_broker_url_problem(url: str, problem: str | None) -> None:
    """A URL whose transport kombu knows passes; any other is one reason, which never repeats
    the value (it may hold a password)."""
    found = broker_url_problem(url)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found
        assert "secret" not in found


def test_every_broker_scheme_is_a_kombu_transport() -> None:
    """The schemes core accepts (listed there: core never imports kombu) are all kombu's."""
    from kombu.transport import TRANSPORT_ALIASES

    assert {name.lower() for name in TRANSPORT_ALIASES} >= BROKER_SCHEMES


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("redis://127.0.0.1:6379/1", None),
        ("rediss://:secret@host:6380/1", None),
        ("sentinel://host:26379", None),
        ("rpc://", None),
        ("db+postgresql://user:secret@host/db", None),
        ("db+sqlite:///results.db", None),
        ("cache+memcached://127.0.0.1:11211/", None),
        ("file:///var/celery/results", None),
        ("s3://", None),  # a Celery backend Recap does not test: Celery's to make work
        ("disabled://", None),
        ("mypackage.backends:MyBackend", None),  # a backend class of one's own
        ("bogus://x", "'bogus'"),
        ("nope+redis://x", "'nope'"),
        ("REDIS://host", "'REDIS'"),  # Celery reads the name as written
        ("redis", "no scheme"),
        ("user:secret", "no scheme"),
        ("user:secret@host", "no scheme"),
        ("://host", "no scheme"),
    ],
)
def test_result_backend_problem(value: str, problem: str | None) -> None:
    """A URL whose scheme names one of Celery's result backends (or a backend class) passes;
    any other is one reason, which never repeats the value (it may hold a password)."""
    found = result_backend_problem(value)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found
        assert "secret" not in found


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("http://127.0.0.1:8000/v1", None),
        ("https://api.openai.com/v1", None),
        ("http://user:secret@proxy:8080/v1", None),
        ("http://[::1]:8000/v1", None),
        ("localhost:8000", "http:// or https://"),
        ("127.0.0.1:8000/v1", "http:// or https://"),
        ("ftp://host/v1", "http:// or https://"),
        ("http://", "host"),
        ("http://:8000/v1", "host"),
        ("http://user:secret@/v1", "host"),
        ("http://host /v1", "host"),
    ],
)
def test_api_base_problem(value: str, problem: str | None) -> None:
    """An upstream or summarizer base URL is http(s) with a host; any other is one reason,
    which never repeats the value."""
    found = api_base_problem(value)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found
        assert "secret" not in found


@pytest.mark.parametrize("name", ["RECAP_UPSTREAM_API_BASE", "RECAP_SUMMARY_API_BASE"])
def test_an_api_base_is_checked_at_start(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Unset or empty is litellm's own default; a value without http(s):// is a settings error
    naming the variable, instead of a 502 on every request."""
    monkeypatch.setenv(name, "")
    assert getattr(load_settings(), name.removeprefix("RECAP_").lower()) == ""
    monkeypatch.setenv(name, "localhost:8000")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert name in str(caught.value) and "localhost" not in str(caught.value)


def test_every_result_backend_is_celerys() -> None:
    """The backend names core accepts (listed there: core never imports Celery) are all
    Celery's."""
    from celery.app.backends import BACKEND_ALIASES

    assert set(BACKEND_ALIASES) >= RESULT_BACKENDS


@pytest.mark.parametrize(
    ("value", "loaded"),
    [("", None), ("  ", None), (" redis://h:6379/1 ", "redis://h:6379/1")],
)
def test_an_empty_result_backend_keeps_no_results(
    monkeypatch: pytest.MonkeyPatch, value: str, loaded: str | None
) -> None:
    """An empty value (compose passes an unset variable as "") means no results kept."""
    monkeypatch.setenv("RECAP_RESULT_BACKEND", value)
    assert load_settings().result_backend == loaded


def test_a_bad_result_backend_is_one_settings_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECAP_RESULT_BACKEND", "bogus://user:secret@host")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert "RECAP_RESULT_BACKEND" in str(caught.value) and "secret" not in str(caught.value)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [("0", "greater than or equal to 1"), ("-1", "RECAP_MAX_INPUT_BYTES"), ("1e3", "integer")],
)
def test_max_input_bytes_is_checked(
    monkeypatch: pytest.MonkeyPatch, value: str, fragment: str
) -> None:
    """The size limit is a positive whole number of bytes, named when it is not."""
    monkeypatch.setenv("RECAP_MAX_INPUT_BYTES", value)
    with pytest.raises(SettingsError, match="RECAP_MAX_INPUT_BYTES") as raised:
        load_settings()
    assert fragment in str(raised.value)


def test_max_input_bytes_default() -> None:
    """64 MiB unless set."""
    assert load_settings().max_input_bytes == 64 * 1024 * 1024


@pytest.mark.parametrize(
    ("size", "limit", "fits"),
    [(0, 10, True), (10, 10, True), (11, 10, False), (3 << 20, 3 << 20, True), (5, 1, False)],
)
def test_read_bytes_stops_past_the_limit(tmp_path: Path, size: int, limit: int, fits: bool) -> None:
    """A file of exactly the limit is read; one byte more is refused, naming the setting."""
    path = tmp_path / "input"
    path.write_bytes(b"a" * size)
    if fits:
        assert read_bytes(path, limit) == b"a" * size
    else:
        with pytest.raises(InputError, match="larger than RECAP_MAX_INPUT_BYTES"):
            read_bytes(path, limit)


def test_an_endless_device_is_refused() -> None:
    """``/dev/zero`` is read up to the limit, then refused."""
    with pytest.raises(InputError, match="/dev/zero is larger than RECAP_MAX_INPUT_BYTES"):
        read_text(Path("/dev/zero"), 1 << 20)


def _escaped(fragment: str) -> str:
    return re.escape(fragment)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The ordinary umask, whatever the test runner's is."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_everything_recap_creates_is_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask_022: None
) -> None:
    """On the defaults (``./recap.db``, ``./.recap/outputs``, ``./.recap/broker``): the database
    and its WAL files 0600, ``.recap/`` and every folder under it 0700, saved outputs and the
    broker's messages 0600."""
    for name in ("RECAP_OUTPUT_DIR", "RECAP_BROKER_FOLDER", "RECAP_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    seed = tmp_path / "seed.jsonl"
    big = {"role": "tool", "tool_call_id": "call_1", "content": "saved output line\n" * 4_000}
    record = {"id": "c", "messages": [USER, {"role": "assistant", "tool_calls": [CALL]}, big]}
    seed.write_text(json.dumps(record) + "\n")
    assert recap("init").code == 0
    assert recap("import", str(seed)).code == 0
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RECAP_")}
    sent = recap_process("compress", "c", "--enqueue", env=environment, timeout=60)
    assert sent.code == 0, sent.stderr
    client = Recap(load_settings())
    with client.engine.connect() as connection:  # an open connection keeps -wal and -shm
        connection.execute(text("select count(*) from messages"))
        database = sorted(tmp_path.glob("recap.db*"))
        assert {p.name for p in database} == {"recap.db", "recap.db-wal", "recap.db-shm"}
        assert {p.name: _mode(p) for p in database} == {p.name: 0o600 for p in database}
    folders = [tmp_path / ".recap", *(p for p in (tmp_path / ".recap").rglob("*") if p.is_dir())]
    files = [p for p in (tmp_path / ".recap").rglob("*") if p.is_file()]
    assert {"outputs", "broker", "queue", "control"} <= {p.name for p in folders}
    assert any(p.suffix == ".msg" for p in files), "the enqueued task left no message file"
    assert any(p.suffix == ".txt" for p in files), "the import saved no output"
    assert {str(p): _mode(p) for p in folders} == {str(p): 0o700 for p in folders}
    messages = [p for p in files if p.suffix in (".msg", ".txt")]
    assert {str(p): _mode(p) for p in messages} == {str(p): 0o600 for p in messages}


def test_folders_that_were_there_keep_their_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask_022: None
) -> None:
    """Only what Recap creates is made private: a database folder the user made stays as it is,
    the folders Recap adds below it are 0700."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    url = f"sqlite:///{shared / 'deep' / 'er' / 'recap.db'}"
    monkeypatch.setenv("RECAP_DATABASE_URL", url)
    assert recap("init").code == 0
    assert _mode(shared) == 0o755
    assert _mode(shared / "deep") == 0o700 and _mode(shared / "deep" / "er") == 0o700
    assert _mode(shared / "deep" / "er" / "recap.db") == 0o600
