"""A provider that counts a chat-completions request by its content, as real tokenizers differ
from tiktoken: prose about 1.0-1.15x cl100k, code and JSON 1.3-1.7x, runs of digits 2x, base64
runs 1.7-2.0x (each session draws its own factors from a seed). The stand-in model server
(``LLMServer(meter=...)``) reports this count as ``prompt_tokens``, the leading messages it saw
in the previous request as ``cached_tokens`` (a prompt cache), and refuses a request over its
window as OpenAI does: HTTP 400, code ``context_length_exceeded``, the count in the message.

No single calibration factor fits such a provider: a turn heavy in JSON or numbers counts more
per tiktoken token than a chatty one, which is what the framework live-loop tests put Recap's
adapters through (``tests/test_frameworks_loop.py``).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import random
import re
import struct
import threading
from dataclasses import dataclass, field
from typing import Any

from recap.core.counting import tokens

ENCODING = "cl100k_base"
DIGITS = re.compile(r"\d+")
DENSE = re.compile(r"[A-Za-z0-9+/]{40,}={0,2}")  # base64 (an attachment, an image's bytes)
CODE_MARKS = frozenset('{}[]()<>;:=",_/\\')
CODE_SHARE = 0.06  # a line with more punctuation than this share of its characters is code
DIGIT_FACTOR = 2.0  # a run of digits costs twice tiktoken's count
MESSAGE_OVERHEAD = 4  # role and framing per message
REPLY_PRIMING = 3  # the reply's own framing
# an image part costs what OpenAI's rule says of its size (not of its bytes): a base, plus a
# price per 512-pixel tile once the image is scaled within 2048 and its short side to 768
IMAGE_BASE = 85
IMAGE_TILE = 170
# what Recap writes where it leaves something out of a request: a summary, the gap note, a
# cleared result's placeholder, a shortened result's or attachment's note, an output cut when it
# was stored (the whole saved to a file), an orphan call's note
NOTES = (
    "Summary of the earlier conversation",
    "[Output truncated:",
    "[No result was recorded for this",
    "left out here",
    "[Cleared:",
    "omitted ...]",
    "characters omitted",
    "[truncated:",
    "[Earlier conversation, compacted.]",
)
TURN_MARK = re.compile(r"^turn (\d+): ")


def png_size(url: str) -> tuple[int, int] | None:
    """A PNG data URL's width and height (None for anything else)."""
    if not url.startswith("data:image/png;base64,"):
        return None
    try:
        head = base64.b64decode(url.split(",", 1)[1][:64] + "==", validate=False)
    except (binascii.Error, ValueError):
        return None
    if len(head) < 24 or head[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", head[16:24])
    return int(width), int(height)


def image_tokens(width: int, height: int) -> int:
    scale = min(1.0, 2048 / max(width, height))
    w, h = width * scale, height * scale
    scale = min(1.0, 768 / min(w, h))
    w, h = w * scale, h * scale
    return IMAGE_BASE + IMAGE_TILE * math.ceil(w / 512) * math.ceil(h / 512)


def _image_url(part: dict[str, Any]) -> str:
    image = part.get("image_url")
    if isinstance(image, dict):
        return str(image.get("url") or "")
    return str(image or "")


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
    return ""


@dataclass
class ContentMeter:
    """One provider's counting, drawn from ``seed``, with a context window of ``window``."""

    window: int
    seed: int = 0
    prose: float = 1.0
    code: float = 1.5
    dense: float = 1.8
    requests: list[int] = field(default_factory=list)  # every request's count, refused ones too
    # the session's tool outputs as the tools gave them, the turns a client replaced by an edit
    # (or whose run failed), and the silent truncations seen: a tool result sent changed with
    # no note of Recap's, or an earlier turn ("turn N: ...") missing with no summary or note
    originals: set[str] = field(default_factory=set)
    replaced: set[int] = field(default_factory=set)
    silent: list[str] = field(default_factory=list)
    _previous: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        self.prose = rng.uniform(1.0, 1.15)
        self.code = rng.uniform(1.3, 1.7)
        self.dense = rng.uniform(1.7, 2.0)

    # --- counting ---------------------------------------------------------------------------

    def text(self, text: str) -> float:
        """Tokens of one text: digit runs, code lines and prose lines each at their own rate."""
        total = 0.0
        for whole in text.splitlines(keepends=True):
            dense = [run for run in DENSE.findall(whole) if any(c.isdigit() for c in run)]
            total += self.dense * sum(tokens.count_text(run, ENCODING) for run in dense)
            line = whole
            for run in dense:
                line = line.replace(run, "")
            digits = DIGITS.findall(line)
            total += DIGIT_FACTOR * sum(tokens.count_text(run, ENCODING) for run in digits)
            rest = DIGITS.sub("", line)
            if not rest.strip():
                total += tokens.count_text(rest, ENCODING) if rest else 0
                continue
            marks = sum(1 for char in rest if char in CODE_MARKS)
            factor = self.code if marks > CODE_SHARE * len(rest) else self.prose
            total += factor * tokens.count_text(rest, ENCODING)
        return total

    def message(self, message: dict[str, Any]) -> float:
        total = float(MESSAGE_OVERHEAD)
        content = message.get("content")
        if isinstance(content, str):
            total += self.text(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    total += self.text(part["text"])
                elif isinstance(part, dict) and (size := png_size(_image_url(part))):
                    total += image_tokens(*size)
                else:
                    total += self.code * tokens.count_text(json.dumps(part), ENCODING)
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            total += self.text(str(function.get("name") or ""))
            arguments = str(function.get("arguments") or "")
            total += self.code * tokens.count_text(arguments, ENCODING)
        for key in ("tool_call_id", "name"):
            if isinstance(message.get(key), str):
                total += tokens.count_text(message[key], ENCODING)
        return total

    def count(self, body: dict[str, Any]) -> int:
        """The request's input tokens, as this provider counts them."""
        messages = [m for m in body.get("messages") or () if isinstance(m, dict)]
        total = REPLY_PRIMING + sum(self.message(m) for m in messages)
        tools = body.get("tools")
        if tools:
            total += self.code * tokens.count_text(json.dumps(tools), ENCODING)
        return math.ceil(total)

    # --- the server's side ------------------------------------------------------------------

    def read(self, body: dict[str, Any]) -> tuple[int, int]:
        """The request's count and its cached share (the leading messages the previous request
        sent too, a provider's prompt cache); remembered as the next request's cache."""
        count = self.count(body)
        messages = [json.dumps(m, sort_keys=True) for m in body.get("messages") or ()]
        silent = self.silences(body)
        with self._lock:
            self.requests.append(count)
            self.silent += silent
            shared = 0
            for old, new in zip(self._previous, messages, strict=False):
                if old != new:
                    break
                shared += 1
            if count <= self.window:
                self._previous = messages
        cached = sum(self.message(json.loads(m)) for m in messages[:shared])
        return count, min(math.floor(cached), count)

    def silences(self, body: dict[str, Any]) -> list[str]:
        """What this request left out without saying so (``silent``)."""
        messages = [m for m in body.get("messages") or () if isinstance(m, dict)]
        texts = [_text_of(m.get("content")) for m in messages]
        noted = any(note in text for text in texts for note in NOTES)
        found: list[str] = []
        for message, text in zip(messages, texts, strict=True):
            if message.get("role") != "tool" or not self.originals or text in self.originals:
                continue
            if not any(note in text for note in NOTES):
                found.append(f"result {message.get('tool_call_id')} changed with no note")
        seen = set()
        for message, text in zip(messages, texts, strict=True):
            mark = TURN_MARK.match(text) if message.get("role") == "user" else None
            if mark:
                seen.add(int(mark.group(1)))
        if seen and not noted:
            missing = sorted(set(range(max(seen))) - seen - self.replaced)
            if missing:
                found.append(f"turns {missing} left out with no summary or note")
        return found

    def over(self) -> list[int]:
        """The counts of the requests over the window."""
        with self._lock:
            return [n for n in self.requests if n > self.window]

    def refusal(self, count: int) -> str:
        """OpenAI's message for a request over the window."""
        return (
            f"This model's maximum context length is {self.window} tokens. However, your "
            f"messages resulted in {count} tokens. Please reduce the length of the messages."
        )
