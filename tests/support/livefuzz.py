"""A host's live loop, fuzzed: assemble, call a provider, record its reading, add the reply.

Each session is drawn from a seed: a window from 2k to 200k tokens, a provider that counts a
constant 0.6-1.6x tiktoken (its reading recorded after a random share of requests), a random
system prompt and tool schemas, and a conversation: one of the shared agent runs replayed step by
step, or a generated chat with agent steps whose tool outputs reach 3x the window, images,
reasoning, edits and branches. The host either compresses only when ``assemble`` raises
``BudgetError`` or a truncated request (the README's loop without a worker, in-process) or after
every turn as a worker would.

What is counted, per request Recap builds:

- ``over_window``: the provider's count exceeds the window once a reading of the session was
  recorded (before any reading, Recap cannot know how the provider counts);
- ``dead_ends``: ``assemble`` fails even after a compression, although the system prompt, the
  tools and the last user message fit (the generator keeps those within a quarter of the window);
- ``silent_truncations``: a message of the branch that is neither in the request, nor covered by
  its summary, nor cleared, nor listed in ``dropped_message_ids``;
- ``calibration_error``: per session after three readings, |factor - the provider's ratio|.

``tests/test_live_fuzz.py`` runs a seeded subset; ``python -m bench fuzz`` the full run.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import random
import re
import statistics
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recap.core.client import Recap
from recap.core.counting import tokens
from recap.core.errors import BudgetError
from recap.core.settings import Settings
from recap.core.storage import store
from recap.core.storage.db import session_scope

DATA = Path(__file__).resolve().parents[1] / "data"
SOURCES = ("swe_agent", "openhands", "tau_bench_airline", "toolbench_examples")
MODELS = ("gpt-4o", "gpt-4o-mini", "gpt-4")
MARK = re.compile(r"⟦(\d+)⟧")
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "file",
    "path",
    "error",
    "value",
    "table",
    "index",
    "build",
    "test",
    "log",
    "run",
]
SAFETY_MARGIN = Settings().safety_margin
FIXED_SHARE = 0.25  # system prompt, tools and a user message stay within this share of the window


@dataclass
class Figures:
    """What a set of sessions counted."""

    sessions: int = 0
    requests: int = 0
    readings: int = 0
    over_window: int = 0
    dead_ends: int = 0
    unfittable: int = 0  # failures where the system prompt, tools and last user message do not fit
    silent_truncations: int = 0
    truncated_requests: int = 0
    compressions: int = 0
    calibration_errors: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # one line per counted failure

    def add(self, other: Figures) -> None:
        for name in (
            "sessions",
            "requests",
            "readings",
            "over_window",
            "dead_ends",
            "unfittable",
            "silent_truncations",
            "truncated_requests",
            "compressions",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.calibration_errors.extend(other.calibration_errors)
        self.failures.extend(other.failures)

    @property
    def calibration_error(self) -> float:
        """The median |factor - ratio| over the sessions with three readings (0 with none)."""
        return statistics.median(self.calibration_errors) if self.calibration_errors else 0.0


def load_sources() -> dict[str, list[list[dict[str, Any]]]]:
    """The shared agent runs, by source."""
    out: dict[str, list[list[dict[str, Any]]]] = {}
    for name in SOURCES:
        lines = (DATA / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
        out[name] = [json.loads(line)["messages"] for line in lines if line.strip()]
    return out


def _png(width: int, height: int) -> str:
    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    rows = zlib.compress(b"".join(b"\0" + bytes(width) for _ in range(height)))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    data = (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")
    )
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(f"{rng.choice(WORDS)}{rng.randrange(1000)}" for _ in range(max(n_words, 1)))


@dataclass
class Plan:
    """One session's draw."""

    seed: int
    window: int
    model: str
    ratio: float
    read_share: float
    worker: bool
    system: str | None
    tools: list[dict[str, Any]] | None
    source: str  # a shared run's name, or "chat"


def draw_plan(seed: int) -> Plan:
    rng = random.Random(seed)
    window = int(math.exp(rng.uniform(math.log(2_000), math.log(200_000))))
    fixed_words = int(window * FIXED_SHARE * 0.3)  # about 1.3 tokens a word, well within the share
    system = _text(rng, rng.randrange(5, max(fixed_words // 2, 6))) if rng.random() < 0.8 else None
    tools = None
    if rng.random() < 0.6:
        tools = [
            {
                "type": "function",
                "function": {
                    "name": f"tool_{n}",
                    "description": _text(rng, rng.randrange(3, max(fixed_words // 10, 4))),
                    "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}},
                },
            }
            for n in range(rng.randrange(1, 4))
        ]
    return Plan(
        seed=seed,
        window=window,
        model=rng.choice(MODELS),
        ratio=rng.uniform(0.6, 1.6),
        read_share=rng.choice((0.1, 0.3, 0.6, 1.0)),
        worker=rng.random() < 0.5,
        system=system,
        tools=tools,
        source=rng.choice((*SOURCES, "chat", "chat")),
    )


class Provider:
    """A provider that counts ``ratio`` x tiktoken (messages, tools and the reply priming)."""

    def __init__(self, model: str, ratio: float) -> None:
        self.model = model
        self.encoding = tokens.encoding_name_for(model)
        self.ratio = ratio

    def count(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
        total = tokens.TOKENS_REPLY_PRIMING
        total += sum(tokens.count_message(m, self.encoding, model=self.model) for m in messages)
        if tools:
            total += tokens.count_tools(tools, self.encoding)
        return math.ceil(total * self.ratio)


class Session:
    """One host session through the live loop."""

    def __init__(self, recap: Recap, plan: Plan, rng: random.Random) -> None:
        self.recap = recap
        self.plan = plan
        self.rng = rng
        self.provider = Provider(plan.model, plan.ratio)
        self.cid = recap.new(model=plan.model, max_input_tokens=plan.window)
        self.figures = Figures(sessions=1)
        self.marks = 0
        self.marked: dict[int, int] = {}  # mark -> message id
        self.readings = 0
        self.user_ids: list[int] = []
        self.last_user: dict[str, Any] | None = None
        self.encoding = tokens.encoding_name_for(plan.model)

    # --- adding -------------------------------------------------------------------------------

    def _mark(self) -> tuple[int, str]:
        self.marks += 1
        return self.marks, f"⟦{self.marks}⟧"

    def add(self, message: dict[str, Any], parent: int | None = None) -> int:
        mark, tag = self._mark()
        message = dict(message)
        content = message.get("content")
        if isinstance(content, list):
            message["content"] = [{"type": "text", "text": tag}, *content]
        elif message.get("role") == "tool":
            message["content"] = f"{tag} {content or ''} {tag}"
        else:
            message["content"] = f"{tag} {content or ''}"
        mid = self.recap.add(self.cid, message, parent_id=parent)
        self.marked[mark] = mid
        if message["role"] == "user":
            self.user_ids.append(mid)
            self.last_user = message
        return mid

    def _fit_user(self, content: Any) -> Any:
        """A user message within the fixed share of the window."""
        if not isinstance(content, str):
            return content
        limit = int(self.plan.window * FIXED_SHARE / 2)
        if tokens.count_text(content, self.encoding) <= limit:
            return content
        return content[: limit * 3]

    # --- the loop ------------------------------------------------------------------------------

    def request(self) -> None:
        """Assemble (compressing once when the request was cut, as the README's loop does), call the
        provider, maybe record its reading, and check what was sent."""
        plan = self.plan
        try:
            built = self.recap.assemble(self.cid, system=plan.system, tools=plan.tools)
            if built.truncated and not plan.worker:  # the README's loop without a worker
                raise BudgetError("compress first")
        except BudgetError:
            self.recap.compress(self.cid)
            self.figures.compressions += 1
            try:
                built = self.recap.assemble(self.cid, system=plan.system, tools=plan.tools)
            except BudgetError as exc:
                if self._fixed_fit():
                    self.figures.dead_ends += 1
                    self.figures.failures.append(f"seed {plan.seed}: dead end: {exc}")
                else:
                    self.figures.unfittable += 1
                return
        self.figures.requests += 1
        counted = self.provider.count(built.messages, plan.tools)
        if self.readings and counted > plan.window:
            self.figures.over_window += 1
            self.figures.failures.append(
                f"seed {plan.seed}: {counted} provider tokens in a {plan.window} window "
                f"(ratio {plan.ratio:.2f}, budget {built.budget}, estimated {built.tokens.total})"
            )
        if built.truncated:
            self.figures.truncated_requests += 1
        self._check_reported(built)
        if self.rng.random() < plan.read_share:
            usage = self.recap.record_usage(self.cid, prompt_tokens=counted)
            self.readings += 1
            self.figures.readings += 1
            if self.readings == 3:
                self.figures.calibration_errors.append(abs(usage.calibration - plan.ratio))

    def _fixed_fit(self) -> bool:
        """Whether the system prompt, the tools and the last user message fit the window within
        the safety margin by the provider's count (only then is a failure a dead end)."""
        plan = self.plan
        parts = [self.last_user] if self.last_user is not None else []
        if plan.system:
            parts.append({"role": "system", "content": plan.system})
        need = self.provider.count(parts, plan.tools)
        return need <= plan.window * (1 - SAFETY_MARGIN)

    def _check_reported(self, built: Any) -> None:
        """Every marked message of the branch is sent, summarized, cleared or reported."""
        sent = {int(m) for m in MARK.findall(json.dumps(built.messages, ensure_ascii=False))}
        with session_scope(self.recap.engine) as session:
            cleared = set(store.load_clearings(session, self.cid))
            summaries = {s.id: s.cutoff_message_id for s in store.load_summaries(session, self.cid)}
        cutoff = summaries.get(built.summary_id, 0) if built.summary_id is not None else 0
        exported = self.recap.export(self.cid)
        dropped = set(built.dropped_message_ids)
        by_id = {mid: mark for mark, mid in self.marked.items()}
        for message in exported["messages"]:
            mid = int(message["id"])
            mark = by_id.get(mid)
            if mark is None or mark in sent or mid <= cutoff or mid in cleared or mid in dropped:
                continue
            self.figures.silent_truncations += 1
            self.figures.failures.append(
                f"seed {self.plan.seed}: message {mid} ({message['role']}) left out silently"
            )

    def turn_done(self) -> None:
        if self.plan.worker:
            self.recap.compress(self.cid)
            self.figures.compressions += 1

    # --- conversations -------------------------------------------------------------------------

    def replay(self, messages: list[dict[str, Any]]) -> None:
        """A shared run step by step: a request before every assistant message."""
        for message in messages:
            role = message.get("role")
            if role == "system":
                if self.plan.system is None and not self.user_ids:
                    self.add({"role": "system", "content": self._fit_user(message["content"])})
                continue
            if role == "assistant":
                self.request()
            if role == "user":
                self.turn_done()
                message = {**message, "content": self._fit_user(message.get("content"))}
            self.add(_clean(message))
        self.request()

    def chat(self, turns: int) -> None:
        """A generated chat: user turns, agent steps with outputs up to 3x the window, images,
        reasoning, and now and then an edit that branches from an earlier user message."""
        rng = self.rng
        window = self.plan.window
        for turn in range(turns):
            parent = None
            if self.user_ids and rng.random() < 0.08:  # an edit: a sibling of an earlier message
                earlier = rng.choice(self.user_ids)
                parent = self._parent_of(earlier)
            content: Any = _text(rng, rng.randrange(3, max(int(window * 0.02), 4)))
            if rng.random() < 0.15:
                side = rng.choice((64, 512, 1024))
                content = [
                    {"type": "text", "text": content},
                    {"type": "image_url", "image_url": {"url": _png(side, side)}},
                ]
            self.add({"role": "user", "content": content}, parent=parent)
            for step in range(rng.choice((0, 0, 1, 2, 4))):
                self.request()
                call = {
                    "id": f"call_{step}",
                    "type": "function",
                    "function": {"name": "tool_0", "arguments": json.dumps({"arg": str(step)})},
                }
                reply: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": [call]}
                if rng.random() < 0.3:
                    reply["reasoning_content"] = _text(rng, rng.randrange(10, 200))
                self.add(reply)
                size = int(window * rng.choice((0.01, 0.05, 0.2, 0.5, 1.0, 3.0)) / 1.3)
                self.add({"role": "tool", "tool_call_id": call["id"], "content": _text(rng, size)})
            self.request()
            answer: dict[str, Any] = {
                "role": "assistant",
                "content": _text(rng, rng.randrange(5, max(int(window * 0.03), 6))),
            }
            if rng.random() < 0.2:
                answer["reasoning_content"] = _text(rng, 50)
            self.add(answer)
            self.turn_done()
            del turn

    def _parent_of(self, message_id: int) -> int | None:
        for message in self.recap.export(self.cid, leaf=message_id)["messages"][-2:-1]:
            return int(message["id"])
        return None


def _clean(message: dict[str, Any]) -> dict[str, Any]:
    """A shared message as a host would add it (the import format's fields only)."""
    keep = ("role", "content", "tool_calls", "tool_call_id", "name")
    return {k: message[k] for k in keep if k in message and message[k] is not None}


def run_session(tmp: Path, seed: int, sources: dict[str, list[list[dict[str, Any]]]]) -> Figures:
    """One seeded session in its own database."""
    plan = draw_plan(seed)
    rng = random.Random(seed * 7919 + 1)
    settings = Settings(
        database_url=f"sqlite:///{tmp / f'fuzz-{seed}.db'}", output_dir=tmp / f"outputs-{seed}"
    )
    recap = Recap(settings, create_schema=True)
    try:
        session = Session(recap, plan, rng)
        if plan.source == "chat":
            session.chat(rng.randrange(6, 30))
        else:
            session.replay(rng.choice(sources[plan.source]))
        return session.figures
    finally:
        recap.engine.dispose()


def run(tmp: Path, seeds: Iterator[int] | range) -> Figures:
    """Every seed's session; the figures added up (Recap's own log lines are left out)."""
    for name in ("recap", "recap.assemble"):
        logging.getLogger(name).setLevel(logging.ERROR)
    sources = load_sources()
    total = Figures()
    for seed in seeds:
        total.add(run_session(tmp, seed, sources))
    return total
