"""Token accounting: offline tiktoken encodings, message and tool overheads, context windows.

Nothing here imports litellm: its bundled tokenizer files and model map are read from disk, so
commands that call no model start fast and work with no network.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import tiktoken

from recap.core.counting import media, reasoning
from recap.core.errors import RecapError

O200K = "o200k_base"
CL100K = "cl100k_base"
# Model names whose tokenizer is o200k; everything else is approximated with cl100k.
O200K_PREFIXES = (
    "gpt-4o",
    "gpt-4.1",
    "gpt-4.5",
    "gpt-5",
    "o1",
    "o3",
    "o4",
    "chatgpt-4o",
    "gpt-oss",
)

TOKENS_PER_MESSAGE = 3  # OpenAI chat format: <|start|>{role}\n ... <|end|>
TOKENS_PER_NAME = 1  # a "name" field costs one token beyond its text
TOKENS_PER_TOOL_CALL = 7  # id, type and the function wrapper of one call
TOKENS_REPLY_PRIMING = 3  # every reply is primed with <|start|>assistant<|message|>
TOKENS_PER_TOOLS_BLOCK = 12  # the namespace wrapper around the tool schemas


class UnknownModelError(RecapError, ValueError):
    """The model has no known context window and no override was given."""


def _litellm_dir() -> Path | None:
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def ensure_offline_encodings() -> None:
    """Point tiktoken at the encodings litellm ships, so no download is ever needed."""
    if os.environ.get("TIKTOKEN_CACHE_DIR"):
        return
    base = _litellm_dir()
    if base is not None:
        os.environ["TIKTOKEN_CACHE_DIR"] = str(base / "litellm_core_utils" / "tokenizers")


def encoding_name_for(model: str) -> str:
    """The tiktoken encoding for a model string such as ``openai/gpt-4o-mini``."""
    name = model.rsplit("/", 1)[-1].lower()
    return O200K if name.startswith(O200K_PREFIXES) else CL100K


@lru_cache(maxsize=8)
def get_encoding(name: str) -> tiktoken.Encoding:
    """A tiktoken encoding, loaded once per process from the offline cache."""
    ensure_offline_encodings()
    return tiktoken.get_encoding(name)


def count_text(text: str, encoding: str) -> int:
    """Tokens of plain text, special tokens treated as ordinary text."""
    if not text:
        return 0
    return len(get_encoding(encoding).encode_ordinary(text))


@lru_cache(maxsize=4096)
def count_short(text: str, encoding: str) -> int:
    """Tokens of a short, often repeated string (a role, a tool name, a call id), cached."""
    return count_text(text, encoding)


def content_text(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts (media
    parts have no text; ``count_message`` counts them by their own rule)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p for p in content if isinstance(p, dict) and not media.kind_of(p)]
        return "\n".join(str(part.get("text", "")) for part in texts)
    return str(content)


def count_message(message: Mapping[str, Any], encoding: str, *, model: str | None = None) -> int:
    """Tokens one OpenAI-format message costs in a request, overheads included; media parts
    (images, audio, files) by the published rule of ``model``'s provider family
    (``core.counting.media.part_tokens``); reasoning and thinking content as ``count_reasoning``
    says."""
    total = TOKENS_PER_MESSAGE + count_short(str(message.get("role", "")), encoding)
    content = message.get("content")
    total += count_text(content_text(content), encoding)
    if isinstance(content, list):
        total += sum(media.part_tokens(part, model) for part in content if media.kind_of(part))
    name = message.get("name")
    if name:
        total += TOKENS_PER_NAME + count_short(str(name), encoding)
    tool_call_id = message.get("tool_call_id")
    if tool_call_id:
        total += count_text(str(tool_call_id), encoding)
    for call in message.get("tool_calls") or ():
        total += count_tool_call(call, encoding)
    return total + count_reasoning(message, encoding, model=model)


TOKENS_PER_REASONING_BLOCK = 3  # a thinking block's type tag, or the reasoning field's key
REASONING_CACHE_SIZE = 2_048  # reasoning texts kept counted: a request resends the same ones


@lru_cache(maxsize=REASONING_CACHE_SIZE)
def _count_reasoning_text(text: str, encoding: str) -> int:
    return count_text(text, encoding)


def count_reasoning(message: Mapping[str, Any], encoding: str, *, model: str | None = None) -> int:
    """Tokens of the reasoning and thinking content in a message's count
    (``core.counting.reasoning``).

    With ``model``: what that model's family sends of it while the message is in the turn in
    progress, the most it is ever sent (a stored count; assembly subtracts what it drops).
    Without: every reasoning string the message carries (a message as it is sent).
    """
    if not reasoning.carries(message):
        return 0
    if model is not None:
        message = reasoning.as_sent(
            dict(message), reasoning.family_of(model), in_progress=True, model=model
        )
    items = sum(reasoning.item_tokens(item) for item in reasoning.items_of(message))
    return items + sum(
        _count_reasoning_text(text, encoding) + (TOKENS_PER_REASONING_BLOCK if first else 0)
        for text, first in reasoning.strings(message)
    )


def count_basis(message: Mapping[str, Any], encoding: str, *, model: str | None = None) -> str:
    """What ``count_message(message, encoding, model=model)`` was made with, as the ``encoding``
    column stores it: the encoding, and the reasoning family when the message carries reasoning
    (``core.counting.reasoning.basis``; ``all`` without a model: every reasoning string counted)."""
    family = reasoning.family_of(model) if model is not None else reasoning.ALL
    return reasoning.basis(encoding, family, message)


def count_tool_call(call: Mapping[str, Any], encoding: str) -> int:
    """Tokens of one assistant tool call: its id, function name and argument text."""
    function = call.get("function") or {}
    return (
        TOKENS_PER_TOOL_CALL
        + count_text(str(call.get("id", "")), encoding)
        + count_short(str(function.get("name", "")), encoding)
        + count_text(str(function.get("arguments", "")), encoding)
    )


def count_messages(messages: Iterable[Mapping[str, Any]], encoding: str) -> int:
    """Tokens of a whole request's messages, reply priming included."""
    return TOKENS_REPLY_PRIMING + sum(count_message(m, encoding) for m in messages)


def count_tools(tools: Sequence[Mapping[str, Any]] | None, encoding: str) -> int:
    """Tokens the tool schemas add to a request (zero when there are none)."""
    if not tools:
        return 0
    text = json.dumps(list(tools), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return TOKENS_PER_TOOLS_BLOCK + count_text(text, encoding)


@lru_cache(maxsize=1)
def _model_map() -> dict[str, Any]:
    base = _litellm_dir()
    if base is None:
        return {}
    path = base / "model_prices_and_context_window_backup.json"
    with path.open(encoding="utf-8") as handle:
        data: dict[str, Any] = json.load(handle)
    return data


def model_info(model: str) -> Mapping[str, Any] | None:
    """litellm's bundled entry for a model, trying the name with and without its provider."""
    table = _model_map()
    for key in (model, model.split("/", 1)[-1], model.rsplit("/", 1)[-1]):
        entry = table.get(key)
        if isinstance(entry, dict) and entry.get("max_input_tokens"):
            return entry
    return None


def context_window(model: str, override: int | None = None) -> int:
    """The input window of a model: the override when given, else litellm's model map."""
    if override is not None:
        if override <= 0:
            raise ValueError(f"max input tokens must be positive, got {override}")
        return override
    entry = model_info(model)
    if entry is None:
        raise UnknownModelError(
            f"unknown model {model!r}: no context window known; pass --max-input-tokens"
        )
    return int(entry["max_input_tokens"])


def available_tokens(window: int, safety_margin: float, fixed: int = 0) -> int:
    """What is left of a window after the safety margin and the fixed parts of a request."""
    return int(window * (1 - safety_margin)) - fixed


@dataclass(frozen=True)
class Calibration:
    """Provider-reported usage against Recap's estimate for the same request."""

    estimated: int
    measured: int

    @property
    def factor(self) -> float:
        """measured / estimated, clamped to a sane range (an outlier must not dominate)."""
        if self.estimated <= 0:
            return 1.0
        return min(max(self.measured / self.estimated, CALIBRATION_MIN), CALIBRATION_MAX)


CALIBRATION_MIN = 0.5  # a provider never counts less than half of tiktoken's estimate
CALIBRATION_MAX = 2.0  # nor more than double it; beyond that the reading is for another request
