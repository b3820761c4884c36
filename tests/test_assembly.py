"""The request view as a pure function: tables of plain branches in, messages and counts out."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

import pytest

from recap.core.counting import tokens
from recap.core.errors import BudgetError, InputError
from recap.core.request.assembly import GAP_NOTE, AssembledRequest, ContextFile, omittable
from recap.core.request.branch import applicable_summary, branch_ids
from recap.core.request.placeholders import cleared_placeholder
from recap.core.request.render import NO_RESULT_TEXT
from recap.core.summaries.prompts import SUMMARY_MESSAGE_PREFIX
from recap.core.values.records import ClearingRec, Msg, SummaryRec
from tests.support.assembling import assemble

MODEL = "gpt-4o-mini"
ENCODING = tokens.encoding_name_for(MODEL)
BIG = 100_000  # a window every small branch fits in
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def msg(spec: str, mid: int, parent: int | None) -> Msg:
    """One message from ``KIND:body[@tokens]``: S system, U user, A assistant, C calls, T result.

    ``C:x,y`` is an assistant calling ``bash`` with call ids x and y; ``T:x:text`` answers x.
    Without ``@tokens`` the message is counted as it would be on import.
    """
    body, _, count = spec.partition("@")
    kind, _, rest = body.partition(":")
    message: dict[str, Any]
    if kind == "C":
        calls = [
            {"id": cid, "type": "function", "function": {"name": "bash", "arguments": "{}"}}
            for cid in rest.split(",")
        ]
        message = {"role": "assistant", "content": None, "tool_calls": calls}
    elif kind == "T":
        call_id, _, text = rest.partition(":")
        message = {"role": "tool", "content": text, "tool_call_id": call_id, "name": "bash"}
    else:
        role = {"S": "system", "U": "user", "A": "assistant"}[kind]
        message = {"role": role, "content": rest}
    return Msg(
        id=mid,
        parent_id=parent,
        role=message["role"],
        content=message["content"],
        tokens=int(count) if count else tokens.count_message(message, ENCODING),
        tool_calls=tuple(message.get("tool_calls") or ()),
        tool_call_id=message.get("tool_call_id"),
        name=message.get("name"),
    )


def chain(*specs: str) -> list[Msg]:
    """A branch of messages with ids 1, 2, 3 ... each the child of the one before."""
    return [msg(spec, i + 1, i or None) for i, spec in enumerate(specs)]


def summary_at(cutoff: int, text: str = "the story so far") -> SummaryRec:
    return SummaryRec(id=7, cutoff_message_id=cutoff, previous_summary_id=None, text=text, tokens=9)


def label(message: dict[str, Any]) -> str:
    """A short name for a request message, so expected orders read as lists of words."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(part["text"] for part in content)
    if message.get("tool_calls"):
        return "call:" + ",".join(call["id"] for call in message["tool_calls"])
    text = content or ""
    for prefix, name in (
        (SUMMARY_MESSAGE_PREFIX, "summary"),
        ("[Context files left out", "note"),
        ("[Cleared:", "cleared"),
    ):
        if text.startswith(prefix):
            return name
    if text.startswith("[Context file: "):
        return "file:" + text.split("]", 1)[0].removeprefix("[Context file: ")
    return {GAP_NOTE: "gap", NO_RESULT_TEXT: "stub"}.get(text, text)


def labels(request: AssembledRequest) -> list[str]:
    return [label(m) for m in request.messages]


def check_request(request: AssembledRequest) -> None:
    """The rules a provider enforces: each call answered right after it, once; no stray result."""
    pending: set[str] = set()
    seen: set[str] = set()
    for position, message in enumerate(request.messages):
        if pending:
            assert message["role"] == "tool", f"message {position}: calls {pending} unanswered"
            assert message["tool_call_id"] in pending, f"message {position}: wrong result"
            pending.discard(message["tool_call_id"])
        elif message["role"] == "tool":
            raise AssertionError(f"message {position}: a result without its call")
        if message["role"] == "assistant" and message.get("tool_calls"):
            ids = [call["id"] for call in message["tool_calls"]]
            assert not set(ids) & seen and len(set(ids)) == len(ids), "a call id is repeated"
            pending, seen = set(ids), seen | set(ids)
    assert not pending, f"calls {pending} unanswered at the end"
    assert request.tokens.total <= request.budget


def run(specs: Sequence[str], **knobs: Any) -> AssembledRequest:
    knobs.setdefault("window", BIG)
    knobs.setdefault("safety_margin", 0.0)
    knobs.setdefault("model", MODEL)
    request = assemble(chain(*specs), **knobs)
    check_request(request)
    return request


@pytest.mark.parametrize(
    ("specs", "knobs", "expected"),
    [
        (["U:u1", "A:a1", "U:u2"], {}, ["u1", "a1", "u2"]),
        (["S:stored", "U:u1"], {}, ["stored", "u1"]),
        (["S:stored", "U:u1"], {"system": "SYS"}, ["SYS", "u1"]),
        (
            ["S:stored", "U:u1", "A:a1", "U:u2"],
            {"summary": summary_at(3)},
            ["stored", "summary", "u2"],
        ),
        (["U:u1", "S:mid", "U:u2"], {}, ["u1", "mid", "u2"]),
        (["U:u1", "A:a1"], {"summary": summary_at(2), "reminder": "REM"}, ["summary", "REM"]),
        (["U:u1", "C:x", "T:x:r", "A:a1"], {"reminder": "REM"}, ["u1", "call:x", "r", "a1", "REM"]),
        (
            ["S:stored", "U:u1", "A:a1", "U:u2", "C:x", "T:x:r"],
            {
                "summary": summary_at(2),
                "system": "SYS",
                "reminder": "REM",
                "tools": TOOLS,
                "context_files": [ContextFile("a", "alpha"), ContextFile("b", "beta")],
            },
            ["SYS", "summary", "a1", "file:a", "file:b", "u2", "call:x", "r", "REM"],
        ),
    ],
    ids=[
        "plain",
        "stored-system",
        "given-system-replaces-stored",
        "stored-system-survives-summary",
        "mid-branch-system-stays",
        "summary-covers-all",
        "tail-after-last-user",
        "every-part",
    ],
)
def test_order(specs: list[str], knobs: dict[str, Any], expected: list[str]) -> None:
    """System, summary, history, context files, last user message, its tail, then the reminder."""
    assert labels(run(specs, **knobs)) == expected


@pytest.mark.parametrize(
    ("window", "margin", "budget"),
    [(1_000, 0.05, 950), (1_000, 0.0, 1_000), (3_000, 0.1, 2_700), (999, 0.05, 949)],
)
def test_budget_is_window_less_margin(window: int, margin: float, budget: int) -> None:
    """The budget is the window less the safety margin, rounded down."""
    request = run(["U:u1@5"], window=window, safety_margin=margin)
    assert request.budget == budget
    assert request.window == window


@pytest.mark.parametrize(
    "knobs",
    [
        {},
        {"system": "You are terse.", "reminder": "Stay on task."},
        {"tools": TOOLS, "summary": summary_at(1)},
        {"context_files": [ContextFile("notes.md", "- item one\n- item two")]},
    ],
    ids=["bare", "system-reminder", "tools-summary", "context"],
)
def test_breakdown_adds_up(knobs: dict[str, Any]) -> None:
    """The total is the parts plus the reply priming, and each part counts what is sent."""
    request = run(["U:u1", "A:a1", "U:u2", "C:x", "T:x:out"], **knobs)
    t = request.tokens
    parts = t.system + t.summary + t.history + t.context + t.tools + t.reminder
    assert t.total == parts + tokens.TOKENS_REPLY_PRIMING
    assert t.tools == tokens.count_tools(knobs.get("tools"), ENCODING)
    sent = {"system": "system" in knobs, "reminder": "reminder" in knobs}
    assert t.system == (
        tokens.count_message(request.messages[0], ENCODING) if sent["system"] else 0
    )
    last = tokens.count_message(request.messages[-1], ENCODING)
    assert t.reminder == (last if sent["reminder"] else 0)
    recount = tokens.count_messages(request.messages, ENCODING) + t.tools
    assert t.total == recount


OLDER = ["U:u1@30", "A:a1@10", "U:u2@50", "A:a2@10", "U:u3@10"]
GAP = tokens.count_message({"role": "user", "content": GAP_NOTE}, ENCODING)
FIXED = tokens.TOKENS_REPLY_PRIMING + 10  # priming and the tail u3


@pytest.mark.parametrize(
    ("room", "expected", "dropped"),
    [
        (100, ["u1", "a1", "u2", "a2", "u3"], []),
        (99, ["gap", "a1", "u2", "a2", "u3"], [1]),
        (60 + GAP, ["gap", "u2", "a2", "u3"], [1, 2]),
        (59 + GAP, ["gap", "a2", "u3"], [1, 2, 3]),
        (25 + GAP, ["gap", "a2", "u3"], [1, 2, 3]),
        (9 + GAP, ["gap", "u3"], [1, 2, 3, 4]),
        (GAP - 1, ["u3"], [1, 2, 3, 4]),
        (0, ["u3"], [1, 2, 3, 4]),
    ],
)
def test_contiguous_suffix(room: int, expected: list[str], dropped: list[int]) -> None:
    """Older history is kept newest first and stops at the first message that does not fit."""
    request = run(OLDER, window=FIXED + room)
    assert labels(request) == expected
    assert request.dropped_message_ids == dropped


@pytest.mark.parametrize(
    ("room", "expected"),
    [
        (90, ["u1", "call:x", "r", "u2"]),
        (59 + GAP, ["gap", "u2"]),
        (60 + GAP, ["gap", "call:x", "r", "u2"]),
    ],
)
def test_call_and_results_kept_together(room: int, expected: list[str]) -> None:
    """A tool call and its results are kept or dropped as one unit."""
    specs = ["U:u1@30", "C:x@20", "T:x:r@40", "U:u2@10"]
    assert labels(run(specs, window=FIXED + room)) == expected


@pytest.mark.parametrize(
    ("specs", "window", "expected", "dropped"),
    [
        # the turn's one step does not fit beside the last user message: the user message alone
        (["U:u1@10", "U:u2@100", "A:a@50"], 150, ["u2"], [1, 3]),
        (["U:u1@10", "C:x@40", "T:x:r@40"], 80, ["u1"], [2, 3]),
        # the newest step fits, the older one goes and a gap note says so
        (["U:u1@10", "C:x@40", "T:x:r@40", "C:y@10", "T:y:s@10"], 80, ["u1", "gap", "call:y", "s"],
         [2, 3]),
    ],
)  # fmt: skip
def test_a_turn_too_long_keeps_its_user_message(
    specs: list[str], window: int, expected: list[str], dropped: list[int]
) -> None:
    """When the last user message fits but its turn does not, the oldest steps of the turn are
    left out (reported), down to the user message alone: never a dead end."""
    request = run(specs, window=window)
    assert labels(request) == expected and request.truncated
    assert request.dropped_message_ids == dropped


@pytest.mark.parametrize(
    ("specs", "knobs", "fragment"),
    [
        (["U:u1@10", "U:u2@200"], {"window": 150}, "last user message"),
        (["U:u1@10"], {"window": 60, "system": "word " * 80}, "left after the system prompt"),
        (["U:u1@10"], {"window": 12, "safety_margin": 0.5}, "window 12"),
    ],
)
def test_tail_must_fit(specs: list[str], knobs: dict[str, Any], fragment: str) -> None:
    """A last user message that cannot fit beside the fixed parts is never cut: a clear error."""
    with pytest.raises(BudgetError, match=fragment):
        run(specs, **knobs)


TREE = [
    ("U:u1", None),
    ("A:a1", 1),
    ("U:u2", 2),
    ("A:a2", 3),
    ("U:u2-edited", 2),  # an edit after the cutoff
    ("U:u1-edited", None),  # an edit before the cutoff (of the root)
    ("A:a1-regenerated", 1),  # a regenerate of the cutoff message itself
]


@pytest.mark.parametrize(
    ("leaf", "expected", "summary_id"),
    [
        (4, ["summary", "u2", "a2"], 7),
        (5, ["summary", "u2-edited"], 7),
        (6, ["u1-edited"], None),
        (7, ["u1", "a1-regenerated"], None),
        (2, ["summary"], 7),
    ],
)
def test_summary_follows_the_branch(leaf: int, expected: list[str], summary_id: int | None) -> None:
    """A summary applies to branches through its cutoff and to no branch edited before it."""
    messages = {i + 1: msg(spec, i + 1, parent) for i, (spec, parent) in enumerate(TREE)}
    path = branch_ids({m.id: m.parent_id for m in messages.values()}, leaf)
    summary = applicable_summary([summary_at(2)], path)
    request = assemble(
        [messages[i] for i in path], model=MODEL, window=BIG, safety_margin=0, summary=summary
    )
    assert labels(request) == expected
    assert request.summary_id == summary_id


def test_summary_off_branch_is_refused() -> None:
    """A summary whose cutoff is not on the branch is an input error, not a duplicated history."""
    with pytest.raises(InputError, match="not on this branch"):
        run(["U:u1", "A:a1"], summary=summary_at(99))


@pytest.mark.parametrize(
    ("specs", "knobs", "expected", "dropped"),
    [
        (["U:u1", "C:x", "T:x:r", "U:u2"], {"summary": summary_at(2)}, ["summary", "u2"], [3]),
        (["U:u1", "C:x"], {}, ["u1", "call:x", "stub"], []),
        (["U:u1", "C:x,y", "T:y:ry", "A:done"], {}, ["u1", "call:x,y", "ry", "stub", "done"], []),
        (["U:u1", "C:x", "U:u2", "T:x:r"], {}, ["u1", "call:x", "r", "u2"], []),
        (["U:u1", "C:x", "T:x:r", "T:x:again", "U:u2"], {}, ["u1", "call:x", "r", "u2"], [4]),
        (
            ["U:u1", "C:x", "T:x:r", "C:x", "T:x:r2"],
            {},
            ["u1", "call:x", "r", "call:x_2", "r2"],
            [],
        ),
        (["U:u1", "C:x,x", "T:x:r", "U:u2"], {}, ["u1", "call:x,x_2", "r", "stub", "u2"], []),
        (
            ["U:u1", "C:x", "C:x_2,x", "T:x:r"],
            {},
            ["u1", "call:x", "r", "call:x_2,x_3", "stub", "stub"],
            [],
        ),
    ],
    ids=[
        "orphan-after-cutoff",
        "unanswered-final",
        "one-of-two",
        "late",
        "repeat",
        "reused-id",
        "reused-in-one-message",
        "reused-next-to-a-renamed-one",
    ],
)
def test_tool_pairs_repaired(
    specs: list[str], knobs: dict[str, Any], expected: list[str], dropped: list[int]
) -> None:
    """Orphan results are dropped, unanswered calls get a stub, late results move up, and a call
    id used again (some servers number calls per turn) is sent under a fresh one, with its
    result: every id in the request is unique and answered once."""
    request = run(specs, **knobs)
    assert labels(request) == expected
    assert request.dropped_message_ids == dropped
    assert request.tokens.total == tokens.count_messages(request.messages, ENCODING)
    stubs = [m for m in request.messages if m.get("content") == NO_RESULT_TEXT]
    assert all(m["role"] == "tool" and m["tool_call_id"].startswith("x") for m in stubs)


def test_stub_is_counted() -> None:
    """A stub result counts as the message it is."""
    request = run(["U:u1@10", "C:x@20"])
    stub = request.messages[-1]
    assert request.tokens.history == 30 + tokens.count_message(stub, ENCODING)


@pytest.mark.parametrize(
    ("output_path", "missing", "fragment"),
    [
        (None, frozenset(), "Run the tool again"),
        ("out/abc.txt", frozenset(), "saved at out/abc.txt"),
        ("out/abc.txt", frozenset({"out/abc.txt"}), "has expired"),
    ],
)
def test_cleared_result_placeholder(
    output_path: str | None, missing: frozenset[str], fragment: str
) -> None:
    """A cleared result renders as its placeholder and counts its stored tokens less the saving."""
    base = chain("U:u1@10", "C:call_9@20", "T:call_9:a long output@500", "U:u2@10")
    branch = [*base[:2], base[2]._replace(output_path=output_path), base[3]]
    clearings = {3: ClearingRec(message_id=3, reason="idle", tokens_reclaimed=460)}
    request = assemble(
        branch,
        model=MODEL,
        window=BIG,
        safety_margin=0,
        clearings=clearings,
        missing_outputs=missing,
    )
    expected = cleared_placeholder(
        tool_name="bash",
        call_id="call_9",
        tokens=500,
        output_path=output_path,
        file_exists=output_path not in missing,
        ref="m3",
    )
    assert request.messages[2]["content"] == expected
    assert fragment in expected
    assert request.tokens.history == 10 + 20 + 40 + 10


OPTIONS = [
    {},
    {"text_only": True},
    {"cache_breakpoints": True, "system": "SYS", "summary": summary_at(1)},
    {"reminder": "REM", "context_files": [ContextFile("a", "x" * 50)], "tools": TOOLS},
]


@pytest.mark.parametrize("knobs", OPTIONS)
def test_deterministic(knobs: dict[str, Any]) -> None:
    """The same stored state gives byte-identical JSON, whatever the options."""
    specs = ["U:u1", "A:a1", "U:u2", "C:x,y", "T:y:ry", "T:x:rx", "C:z"]
    first = assemble(chain(*specs), model=MODEL, window=BIG, safety_margin=0.05, **knobs)
    second = assemble(chain(*specs), model=MODEL, window=BIG, safety_margin=0.05, **knobs)
    assert json.dumps(first.as_dict()) == json.dumps(second.as_dict())


def test_text_only_rendering() -> None:
    """Text-only turns carry no tool roles: calls become assistant text, results one user turn."""
    specs = ["U:u1", "C:x,y", "T:x:rx", "T:y:ry", "A:done"]
    request = run(specs, text_only=True)
    assert [m["role"] for m in request.messages] == ["user", "assistant", "user", "assistant"]
    assert all(set(m) == {"role", "content"} for m in request.messages)
    call_text, result_text = request.messages[1]["content"], request.messages[2]["content"]
    assert call_text == "[Tool call x: bash {}]\n[Tool call y: bash {}]"
    assert result_text == "[Tool result x (bash)]\nrx\n\n[Tool result y (bash)]\nry"
    assert request.tokens.history == tokens.count_messages(request.messages, ENCODING) - 3


def test_text_only_unanswered_call() -> None:
    """An unanswered call still gets its stub in text-only form."""
    request = run(["U:u1", "C:x"], text_only=True)
    assert request.messages[-1]["content"] == f"[Tool result x (bash)]\n{NO_RESULT_TEXT}"


def _marked(request: AssembledRequest) -> list[int]:
    return [
        i
        for i, m in enumerate(request.messages)
        if isinstance(m["content"], list) and "cache_control" in m["content"][-1]
    ]


@pytest.mark.parametrize(
    ("script", "knobs", "marked"),
    [
        # the prefix (system, summary) and the two newest messages: four marks
        (["U:u1", "A:a1", "U:u2", "A:a2", "U:u3"], {"system": "SYS", "summary": 1}, [0, 1, 4, 5]),
        # no summary: the system prompt and the two newest
        (["U:u1", "A:a1", "U:u2"], {"system": "SYS"}, [0, 2, 3]),
        # the reminder is never marked (it changes): the two messages before it
        (["U:u1", "A:a1", "U:u2"], {"system": "SYS", "reminder": "R"}, [0, 2, 3]),
        # no prefix: the rolling marks alone
        (["U:u1", "A:a1", "U:u2"], {}, [1, 2]),
    ],
)
def test_cache_marks_the_prefix_and_the_newest(
    script: list[str], knobs: dict[str, Any], marked: list[int]
) -> None:
    """The stable prefix and the newest two messages carry a cache mark, at most four, and the
    marks are counted in the request."""
    if "summary" in knobs:
        knobs = {**knobs, "summary": summary_at(knobs["summary"])}
    request = run(script, cache_breakpoints=True, **knobs)
    assert _marked(request) == marked and len(marked) <= 4
    plain = run(script, cache_breakpoints=False, **knobs)
    assert _marked(plain) == []
    assert request.tokens.total == plain.tokens.total + sum(
        tokens.count_message(request.messages[i], "o200k_base")
        - tokens.count_message(plain.messages[i], "o200k_base")
        for i in marked
    )


def test_cache_marks_are_on_by_default_for_anthropic_models() -> None:
    """Without a choice, an Anthropic model's request is marked and an OpenAI one's is not."""
    assert _marked(run(["U:u1", "A:a1", "U:u2"], system="SYS", model="claude-3-5-sonnet-20241022"))
    assert not _marked(run(["U:u1", "A:a1", "U:u2"], system="SYS"))


@pytest.mark.parametrize(
    ("room_for_files", "expected", "forgotten"),
    [
        (10_000, ["file:a", "file:big", "file:c"], []),
        (300, ["file:a", "file:c", "note"], ["big"]),
        (5, [], ["a", "big", "c"]),
    ],
)
def test_context_files_fit_or_are_forgotten(
    room_for_files: int, expected: list[str], forgotten: list[str]
) -> None:
    """Context files are kept whole or listed as forgotten, with a note when it fits."""
    files = [ContextFile("a", "alpha"), ContextFile("big", "word " * 2_000), ContextFile("c", "c")]
    base = run(["U:u1@10"])
    request = run(["U:u1@10"], context_files=files, window=base.tokens.total + room_for_files)
    assert [x for x in labels(request) if x != "u1"] == expected
    assert request.forgotten_files == forgotten


@pytest.mark.parametrize(
    ("specs", "knobs", "fragment"),
    [
        (["U:u1"], {"window": 0}, "positive"),
        (["U:u1"], {"safety_margin": 1.0}, "safety margin"),
        ([], {}, "nothing to send"),
        (["S:only a prompt"], {}, "nothing to send"),
    ],
)
def test_bad_input(specs: list[str], knobs: dict[str, Any], fragment: str) -> None:
    """Impossible knobs and empty branches are one clear input error."""
    with pytest.raises(InputError, match=fragment):
        run(specs, **knobs)


def light(*specs: str) -> tuple[list[tuple[str, int, str | None]], dict[int, set[str]]]:
    """Rows for ``omittable`` from ``ROLE:tokens[:call]`` (C calls, T answers)."""
    rows: list[tuple[str, int, str | None]] = []
    calls: dict[int, set[str]] = {}
    for index, spec in enumerate(specs):
        kind, count, *call = spec.split(":")
        role = {"U": "user", "A": "assistant", "C": "assistant", "T": "tool"}[kind]
        rows.append((role, int(count), call[0] if kind == "T" else None))
        calls[index] = set(call) if kind == "C" else set()
    return rows, calls


@pytest.mark.parametrize(
    ("specs", "budget", "expected"),
    [
        (["U:10", "A:10", "U:10"], 100, 0),
        (["U:50", "A:50", "U:10", "A:10"], 60, 2),
        (["U:10", "A:100", "A:100"], 50, 0),
        (["U:10", "C:10:x", "T:100:x", "U:10"], 100, 2),
        (["U:10", "C:10:x", "U:10", "T:100:x"], 100, 0),
        (["A:50", "U:50"], 40, 1),
    ],
    ids=["all-fit", "crossing", "no-user-after", "result-with-call", "late-result", "at-last-user"],
)
def test_omittable(specs: list[str], budget: int, expected: int) -> None:
    """Only messages that no request within the budget can hold are counted out, never the last
    user message."""
    rows, calls = light(*specs)
    assert omittable(len(rows), budget, rows.__getitem__, calls.__getitem__) == expected


@pytest.mark.parametrize("window", [60, 120, 400, 2_000])
def test_omitted_prefix_changes_nothing(window: int) -> None:
    """Passing the omittable prefix as ``omitted`` gives the same request as passing it all."""
    specs = ["S:sys@10", "U:u1@30", "C:x@20", "T:x:r@40", "U:u2@10", "A:a2@30", "U:u3@10"]
    branch = chain(*specs)
    knobs: dict[str, Any] = {"model": MODEL, "window": window, "safety_margin": 0.0}
    whole = assemble(branch, **knobs)
    after = branch[1:]
    rows = [(m.role, m.tokens, m.tool_call_id) for m in after]
    skip = omittable(len(rows), window, rows.__getitem__, lambda i: set(after[i].tool_call_ids))
    part = assemble([branch[0], *after[skip:]], omitted=[m.id for m in after[:skip]], **knobs)
    assert part.as_dict() == whole.as_dict()


def test_fresh_call_ids_are_paid_for_within_the_budget() -> None:
    """A fresh id costs a token or two; when that takes the history over the budget, it is
    fitted again with less room (older messages go), and a tail that no longer fits is the
    usual budget error."""
    specs = ["U:u0", "A:a0", "U:u1", "C:x", "T:x:r", "U:u2", "C:x", "T:x:r2"]
    whole = run(specs)
    assert whole.tokens.total == tokens.count_messages(whole.messages, ENCODING)
    fitted = run(specs, window=whole.tokens.total - 1)
    assert fitted.dropped_message_ids and fitted.tokens.total <= fitted.budget
    assert fitted.tokens.total == tokens.count_messages(fitted.messages, ENCODING)
    tail_only = ["U:u1", "C:x", "T:x:r", "C:x", "T:x:r2"]
    exact = run(tail_only).tokens.total
    with pytest.raises(BudgetError, match="the last user message and what follows"):
        run(tail_only, window=exact - 1)


@pytest.mark.parametrize(
    "knobs",
    [
        {"summary": 1},
        {"reminder": "R"},
        {"context_files": [ContextFile("a.md", "A")]},
        {"summary": 1, "reminder": "R", "context_files": [ContextFile("a.md", "A")]},
    ],
)
def test_text_only_turns_alternate(knobs: dict[str, Any]) -> None:
    """A text-only request alternates user and assistant strictly after the system prompt,
    whatever Recap adds (a summary, context files, a reminder), and its count is exact."""
    if "summary" in knobs:
        knobs = {**knobs, "summary": summary_at(knobs["summary"])}
    request = run(
        ["U:u1", "C:x", "T:x:r", "A:a1", "U:u2", "C:y", "T:y:s"],
        system="SYS",
        text_only=True,
        **knobs,
    )
    roles = [m["role"] for m in request.messages[1:]]
    assert all(a != b for a, b in itertools.pairwise(roles)), roles
    assert request.tokens.total == tokens.count_messages(request.messages, "o200k_base")
