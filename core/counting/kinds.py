"""What a request is made of, by kind of content (pure): prose, code and JSON, digit runs, and
base64 or other dense strings.

Providers' tokenizers differ from tiktoken by kind of content more than by anything else: prose
counts about the same, code and JSON more, digit runs up to twice, base64 and hex strings more
still. The calibration (``core.counting.calibration``) learns one factor per kind, so it needs
each request's composition: its estimated tokens split by kind.

The rules are cheap on purpose (``assemble`` runs them over every request it builds): one pass of
regular expressions per line, no tokenizer. A line's characters go to a kind, and each kind's
characters become tokens at its own rate (about what ``cl100k_base`` gives for that kind); the
shares are then scaled to Recap's own count of the request, so that a composition always adds up
to the estimate a reading is compared with. What is not text (framing, media) is spread over the
kinds in proportion, a request without any text is all prose.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

KINDS = ("prose", "code", "digits", "other")
PROSE, CODE, DIGITS, OTHER = range(len(KINDS))

# A run of the base64 (or hex) alphabet this long, with letters and digits both, is dense data.
DENSE = re.compile(r"(?<![A-Za-z0-9+/_-])[A-Za-z0-9+/_-]{32,}={0,2}")  # from a run's start only
DIGIT_RUN = re.compile(r"\d+")
# Characters that mark code and JSON; a line with more of them than CODE_SHARE of its
# characters is code.
CODE_MARKS = frozenset('{}[]()<>;:="\\|&*#@$')
CODE_SHARE = 0.05
# Characters per estimated token of each kind (prose and code as cl100k averages them; digits
# are counted by their groups of three, as cl100k and o200k split them, a run's last group
# counted as a whole token on average; dense strings as cl100k counts base64, about 1.4 a
# token, hex nearer 1.7: the larger share, as a dense string under-counted raises its rate).
CHARS_PER_TOKEN = {PROSE: 4.5, CODE: 3.3, OTHER: 1.4}

Composition = tuple[float, ...]  # estimated tokens per kind, in the order of ``KINDS``


_MARKS_GONE = str.maketrans("", "", "".join(sorted(CODE_MARKS)))
_DIGITS_GONE = str.maketrans("", "", "0123456789")
_CACHE_SIZE = 16_384  # texts' weights kept by hash: a conversation's requests repeat them
_cache: dict[int, tuple[float, float, float, float]] = {}


def _dense(run: str) -> bool:
    digits = len(run) - len(run.translate(_DIGITS_GONE))
    return 2 <= digits < len(run) - 1


def text_weights(text: str) -> tuple[float, float, float, float]:
    """Approximate tokens of ``text`` per kind (before scaling to any count); remembered by the
    text's hash for the texts seen last, as a conversation's next request sends most of them
    again (two texts of one hash, a chance of one in 2**64, would share a composition: a
    calibration a little off, nothing worse)."""
    key = hash(text)
    found = _cache.get(key)
    if found is None:
        found = _text_weights(text)
        if len(_cache) >= _CACHE_SIZE:
            _cache.clear()
        _cache[key] = found
    return found


def _text_weights(text: str) -> tuple[float, float, float, float]:
    chars = [0, 0, 0, 0]
    digit_tokens = 0.0
    for line in text.splitlines():
        rest = line
        if len(line) >= 32:
            dense = [run for run in DENSE.findall(line) if _dense(run)]
            if dense:
                chars[OTHER] += sum(len(run) for run in dense)
                for run in dense:
                    rest = rest.replace(run, " ")
        without = rest.translate(_DIGITS_GONE)
        if len(without) < len(rest):  # digit runs: a token per group of three, about
            runs = len(DIGIT_RUN.findall(rest))
            digit_chars = len(rest) - len(without)
            digit_tokens += (digit_chars + 2 * runs) / 3
            chars[DIGITS] += digit_chars
            rest = without
        size = len(rest.strip())
        if not size:
            continue
        marks = size - len(rest.strip().translate(_MARKS_GONE))
        chars[CODE if marks > CODE_SHARE * size else PROSE] += size
    return (
        chars[PROSE] / CHARS_PER_TOKEN[PROSE],
        chars[CODE] / CHARS_PER_TOKEN[CODE],
        digit_tokens,
        chars[OTHER] / CHARS_PER_TOKEN[OTHER],
    )


def _as_code(text: str) -> tuple[float, float, float, float]:
    """Text that is code or JSON as a whole (tool arguments and schemas), digits apart."""
    prose, code, digits, other = text_weights(text)
    return (0.0, prose + code, digits, other)


def _is_mapping(value: Any) -> bool:
    return type(value) is dict or isinstance(value, Mapping)


def message_weights(message: Mapping[str, Any]) -> list[float]:
    """Approximate tokens of one chat-completions message per kind: its text content and text
    parts, its tool calls' names and arguments (arguments as code), its reasoning text."""
    return list(_message_weights(message))


def _message_weights(message: Mapping[str, Any]) -> tuple[float, float, float, float]:
    """``message_weights`` as a tuple: each part's weights added in the message's order (its
    content, its tool calls, its reasoning), to the same sums whichever path a message takes."""
    content = message.get("content")
    calls = message.get("tool_calls")
    reasoning = len(message) > 2 and ("reasoning_content" in message or "thinking" in message)
    if type(content) is str and not calls and not reasoning:  # one text: the common case
        return text_weights(content)
    parts: list[tuple[float, float, float, float]] = []
    if type(content) is str:
        parts.append(text_weights(content))
    elif isinstance(content, list):
        for part in content:
            if _is_mapping(part) and isinstance(part.get("text"), str):
                parts.append(text_weights(part["text"]))
    for call in calls or ():
        function: Any = call.get("function") if _is_mapping(call) else None
        if function is not None and _is_mapping(function):
            parts.append(text_weights(str(function.get("name") or "")))
            parts.append(_as_code(str(function.get("arguments") or "")))
    if reasoning:
        for key in ("reasoning_content", "thinking"):
            if isinstance(message.get(key), str):
                parts.append(text_weights(message[key]))
    prose = code = digits = other = 0.0
    for weights in parts:
        prose += weights[PROSE]
        code += weights[CODE]
        digits += weights[DIGITS]
        other += weights[OTHER]
    return (prose, code, digits, other)


def composition(messages: Iterable[Mapping[str, Any]], tools: Any, total: int) -> Composition:
    """The request's ``total`` estimated tokens split by kind: the messages' and the tool
    schemas' (as code) approximate tokens per kind, scaled to ``total``."""
    prose = code = digits = other = 0.0
    for message in messages:
        if not _is_mapping(message):
            continue
        weights = _message_weights(message)
        prose += weights[PROSE]
        code += weights[CODE]
        digits += weights[DIGITS]
        other += weights[OTHER]
    if tools:
        _, more_code, more_digits, more_other = _as_code(
            json.dumps(tools, separators=(",", ":"), default=str)
        )
        code, digits, other = code + more_code, digits + more_digits, other + more_other
    return scaled((prose, code, digits, other), total)


def scaled(weights: Iterable[float], total: int) -> Composition:
    """``weights`` scaled to add up to ``total`` (all prose when they add up to nothing)."""
    values = [max(value, 0.0) for value in weights]
    whole = sum(values)
    if total <= 0:
        return (0.0,) * len(KINDS)
    if whole <= 0:
        return (float(total),) + (0.0,) * (len(KINDS) - 1)
    return tuple(total * value / whole for value in values)


def encode(parts: Composition | None) -> str | None:
    """A composition as stored: the tokens per kind, rounded, space-separated."""
    if parts is None:
        return None
    return " ".join(f"{value:.1f}" for value in parts)


def decode(text: str | None) -> Composition | None:
    """A stored composition read back (None for nothing stored or anything malformed)."""
    if not text:
        return None
    try:
        values = tuple(float(part) for part in text.split())
    except ValueError:
        return None
    if len(values) != len(KINDS) or any(value < 0 for value in values):
        return None
    return values
