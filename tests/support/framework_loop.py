"""The live loop through a framework adapter: seeded sessions of a LangChain or Pydantic AI agent
talking to the stand-in model server, which counts by content (``content_meter``), with a real
``recap worker`` compressing between turns.

Each session draws a window (3k or 6k tokens in the fast subset), the provider's factors, and a
conversation: user turns mixing prose, code, JSON and numbers, model answers of either kind, and
tool calls whose JSON outputs reach half the window (a fifth of them carrying a base64
attachment). What is counted, per session:

- ``over_window``: requests the provider counted above the window (it refused them);
- ``dead_ends``: agent runs that failed, although the system prompt, the tools and the user
  message fit the window by the provider's count;
- ``readings``: the usage rows Recap stored for the conversation, and whether any carried the
  provider's cached tokens; ``calibration``: the stored factor at the end (``recap stats``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import struct
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text

from recap.core.client import Recap
from recap.core.counting import calibration, kinds
from tests.support.content_meter import ContentMeter
from tests.support.frameworks_stack import FrameworkStack, tool_call_reply
from tests.support.llm_server import LLMServer, Reply

SYSTEM = (
    "You are the support agent of an online shop. Answer in short sentences, quote order ids, "
    "tracking numbers and amounts exactly as the tools give them, and never invent a status. "
    "When a customer asks about an order, look it up first; when they ask about a refund, "
    "check the payment record. Escalate to a human when the customer asks for one, when a "
    "refund is over 500 EUR, or when the order history looks inconsistent."
)
TOOL_NAME = "lookup"
PROSE_TEXT = (
    "the customer wrote again about the parcel that was supposed to arrive before the weekend "
    "and asked whether the courier could leave it with a neighbour or at the pickup point near "
    "the station since nobody will be home during the day"
)
PROSE = PROSE_TEXT.split(" ")
CODE_LINES = [
    "def refund(order_id: str, amount: float) -> dict[str, object]:",
    '    return {"order": order_id, "amount": round(amount, 2), "status": "pending"}',
    "SELECT id, status, total FROM orders WHERE customer_id = :cid ORDER BY created_at;",
    'if (order.status === "shipped") { notify(order.id, ["email", "sms"]); }',
]


def prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(PROSE) for _ in range(max(words, 1)))


def numbers(rng: random.Random, count: int) -> str:
    return " ".join(str(rng.randrange(10**6, 10**12)) for _ in range(max(count, 1)))


def json_blob(rng: random.Random, tokens: int, attachment: bool = False) -> str:
    """A JSON tool output of about ``tokens`` tiktoken tokens; with ``attachment``, a third of
    them a base64 attachment."""
    rows: list[dict[str, Any]] = []
    size = 0
    if attachment:
        data = base64.b64encode(rng.randbytes(max(tokens // 3, 8) * 2)).decode()
        rows.append({"order_id": "scan", "attachment": data})
        size += tokens // 3
    while size < tokens:
        rows.append(
            {
                "order_id": f"A{rng.randrange(10**5)}",
                "tracking": numbers(rng, 1),
                "status": rng.choice(["shipped", "pending", "returned", "lost"]),
                "note": prose(rng, rng.randrange(3, 12)),
            }
        )
        size += 45
    return json.dumps({"orders": rows})


def user_turn(rng: random.Random, window: int, turn: int) -> str:
    """A user message within about 6 % of the window: prose, and code, JSON or numbers."""
    budget = int(window * rng.uniform(0.01, 0.06))
    parts = [f"turn {turn}: " + prose(rng, budget // 2)]
    kind = rng.choice(["code", "json", "numbers", "prose"])
    if kind == "code":
        parts.append("\n".join(rng.sample(CODE_LINES, 2)))
    elif kind == "json":
        parts.append(json_blob(rng, budget // 3))
    elif kind == "numbers":
        parts.append("my references: " + numbers(rng, budget // 8))
    return "\n".join(parts)


def png(width: int, height: int) -> str:
    """A blank PNG of ``width`` x ``height`` as a data URL (what a screenshot is sent as)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    rows = zlib.compress(b"".join(b"\0" + bytes(width) for _ in range(height)))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    chunks = chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")
    body = b"\x89PNG\r\n\x1a\n" + chunks
    return "data:image/png;base64," + base64.b64encode(body).decode()


def model_reply(seed: int) -> Callable[[dict[str, Any]], str]:
    """The stand-in model's answers: prose, code or numbers, about 60-200 tokens each."""
    rng = random.Random(seed * 31 + 7)

    def answer(body: dict[str, Any]) -> str:
        kind = rng.choice(["prose", "prose", "code", "numbers"])
        if kind == "code":
            return "Here is the change:\n" + "\n".join(rng.choices(CODE_LINES, k=4))
        if kind == "numbers":
            return "The tracking numbers are " + numbers(rng, rng.randrange(10, 30))
        return prose(rng, rng.randrange(40, 140))

    return answer


SHARES = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5)  # a tool output's size, as a share of the window
LARGE_SHARES = (*SHARES, 1.0, 2.0, 3.0)  # with ``large``: outputs up to 3x the window
IMAGE_SIDES = (64, 512, 1024)  # a screenshot's side in pixels
IMAGE_SHARE = 0.2  # of the turns after the first, those sending an image with the text
EDIT_SHARE = 0.15  # of the turns after the second, those sent as an edit of the turn before

# A user message: text, or OpenAI content parts (the text and an image).
Content = str | list[dict[str, Any]]


@dataclass
class Draw:
    """One session: its window, provider and turns. The options beyond the defaults draw from a
    random stream of their own, so a draw without them is the same session as ever:
    ``large`` lets tool outputs reach 3x the window (``LARGE_SHARES``), ``images`` sends a PNG
    with some user messages, ``edits`` marks some turns as a client editing its previous user
    message and sending it again (a branch), ``stream`` asks the serve doors to stream."""

    seed: int
    window: int
    turns: int
    large: bool = False
    images: bool = False
    edits: bool = False
    stream: bool = False
    outputs: dict[str, str] = field(default_factory=dict)  # tool call key -> its JSON output
    edited: set[int] = field(default_factory=set)  # turns sent as an edit of the one before

    def plan(self) -> list[tuple[Content, list[str]]]:
        """Each turn's user message and the keys of the tool calls the model makes first."""
        rng = random.Random(self.seed)
        extra = random.Random(self.seed * 7919 + self.window)
        shares = LARGE_SHARES if self.large else SHARES
        turns: list[tuple[Content, list[str]]] = []
        self.edited = set()
        for turn in range(self.turns):
            calls = []
            for step in range(rng.choice([0, 0, 1, 1, 2])):
                key = f"t{turn}s{step}"
                share = rng.choice(shares)
                scan = rng.random() < 0.2
                self.outputs[key] = json_blob(rng, int(self.window * share / 1.4), scan)
                calls.append(key)
            message: Content = user_turn(rng, self.window, turn)
            # both options drawn every turn, so a door without one gets the same other
            image, side = extra.random() < IMAGE_SHARE, extra.choice(IMAGE_SIDES)
            edit = extra.random() < EDIT_SHARE
            if self.images and turn > 0 and image:
                message = [
                    {"type": "text", "text": message},
                    {"type": "image_url", "image_url": {"url": png(side, side)}},
                ]
            if self.edits and edit and turn > 1 and turn - 1 not in self.edited:
                self.edited.add(turn)
            turns.append((message, calls))
        return turns


@dataclass
class Figures:
    """What a set of sessions counted."""

    sessions: int = 0
    turns: int = 0
    requests: int = 0
    over_window: int = 0
    dead_ends: int = 0
    silent_truncations: int = 0  # tool results or turns left out of a request without a note
    readings: int = 0
    cached_readings: int = 0
    uncalibrated: int = 0  # sessions whose stored factor stayed 1.0
    failures: list[str] = field(default_factory=list)
    # per reading after a session's third: |predicted / measured - 1| by the rates per kind
    # fitted over the readings before it, and by the single factor of the reading before it
    calibration_errors: list[float] = field(default_factory=list)
    single_factor_errors: list[float] = field(default_factory=list)

    def add(self, other: Figures) -> None:
        for name in (
            "sessions",
            "turns",
            "requests",
            "over_window",
            "dead_ends",
            "silent_truncations",
            "readings",
            "cached_readings",
            "uncalibrated",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.failures.extend(other.failures)
        self.calibration_errors.extend(other.calibration_errors)
        self.single_factor_errors.extend(other.single_factor_errors)


# A turn: the user message in; the agent runs (raising on failure) in the session's event loop.
# With ``edit=True`` (only passed for a draw with ``edits``), the message replaces the client's
# previous user message and what followed it, as a client editing that message and resending.
Talk = Callable[..., Any]
# An adapter's session maker: (recap, server, conversation id, window, tool outputs) -> talk.
MakeTalk = Callable[[Recap, LLMServer, str, int, dict[str, str]], Talk]


def tool_reply(key: str) -> Reply:
    return tool_call_reply(f"call_{key}", TOOL_NAME, json.dumps({"key": key}))


async def run_session(
    stack: FrameworkStack,
    recap: Recap,
    make: MakeTalk,
    draw: Draw,
    name: str,
    upstream: LLMServer | None = None,
) -> Figures:
    """One seeded session through an adapter; the worker's run after each turn is waited for.
    The model server is a new one, or ``upstream`` (a `recap serve`'s, kept running) given this
    session's provider and answers."""
    meter = ContentMeter(draw.window, seed=draw.seed)
    turns = draw.plan()
    meter.originals = set(draw.outputs.values())
    meter.replaced = {turn - 1 for turn in draw.edited}
    if upstream is not None:
        upstream.clear_script()
        upstream.meter, upstream.default = meter, model_reply(draw.seed)
    server = upstream or LLMServer(default=model_reply(draw.seed), meter=meter).start()
    figures = Figures(sessions=1)
    cid = f"{name}-{draw.seed}-{draw.window}"
    try:
        talk = make(recap, server, cid, draw.window, draw.outputs)
        done = 0  # turns that ended, each having enqueued one run
        for turn, (message, calls) in enumerate(turns):
            for key in calls:
                server.script(tool_reply(key))
            figures.turns += 1
            try:
                if turn in draw.edited:
                    await talk(message, edit=True)
                else:
                    await talk(message)
                done += 1
            except Exception as exc:
                server.clear_script()  # the tool calls of a failed turn are not answered
                figures.dead_ends += 1
                meter.replaced.add(turn)  # a failed run: the framework may not keep it
                figures.failures.append(
                    f"{cid} turn {turn}: dead end: {type(exc).__name__}: {str(exc)[:160]}"
                )
            await asyncio.to_thread(stack.wait_runs, cid, done)
        figures.requests = len(meter.requests)
        over = meter.over()
        figures.over_window = len(over)
        if over:
            figures.failures.append(f"{cid}: requests over the {draw.window} window: {over}")
        # a streamed reply reaches the client before `recap serve` stores its usage: the last
        # request's reading may land a moment after the turn ended
        await asyncio.to_thread(_wait_readings, recap, cid, len(meter.requests) - len(over))
        figures.silent_truncations = len(meter.silent)
        figures.failures += [f"{cid}: silent truncation: {line}" for line in meter.silent[:5]]
        _readings(recap, cid, figures)
    finally:
        if upstream is None:
            server.stop()
    return figures


READING_WAIT = 10.0  # seconds a session's last readings may take to be stored


def _wait_readings(recap: Recap, cid: str, count: int) -> None:
    """Until ``count`` usage rows of the conversation are stored, or ``READING_WAIT`` passed."""
    deadline = time.monotonic() + READING_WAIT
    query = text("SELECT count(*) FROM usage WHERE conversation_id = :c")
    while time.monotonic() < deadline:
        with recap.engine.connect() as connection:
            if (connection.execute(query, {"c": cid}).scalar() or 0) >= count:
                return
        time.sleep(0.05)


def _readings(recap: Recap, cid: str, figures: Figures) -> None:
    with recap.engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT prompt_tokens, cached_tokens, estimated_tokens, kinds FROM usage "
                "WHERE conversation_id = :c ORDER BY id"
            ),
            {"c": cid},
        ).all()
    _calibration_errors(rows, figures)
    figures.readings += len(rows)
    figures.cached_readings += sum(1 for row in rows if row[1])
    stats = recap.stats(cid)
    if stats.calibration == 1.0:
        figures.uncalibrated += 1
        figures.failures.append(f"{cid}: no calibration stored ({len(rows)} usage rows)")


def _calibration_errors(rows: Sequence[Any], figures: Figures) -> None:
    """How well each reading after the third was predicted before it was made: by the rates per
    kind of content fitted over the readings before it, and by the single factor of the one
    before it (what one factor per conversation would have planned with)."""
    samples: list[calibration.Sample] = []
    previous: float | None = None
    for measured, _cached, estimated, stored in rows:
        composition = kinds.decode(stored)
        if composition is None or measured <= 0 or estimated <= 0:
            continue
        if len(samples) >= 3 and previous is not None:
            fitted = calibration.fit(samples[::-1])
            if fitted is not None:
                predicted = fitted.predicted(composition)
                figures.calibration_errors.append(abs(predicted / measured - 1))
            figures.single_factor_errors.append(abs(previous * estimated / measured - 1))
        samples.append(calibration.Sample(composition, int(measured)))
        previous = measured / estimated
