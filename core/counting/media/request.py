"""Media in the request: what is sent in full, what as a placeholder, and its size in bytes."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from recap.core.counting.media.kinds import AUDIO, META_KEY
from recap.core.counting.media.parts import data_of, kind_of, meta_of, ref_of
from recap.core.counting.media.text import placeholder_part

Loader = Callable[[str], str | None]


"""Gives a stored part's base64 text back by its content name, or None when it is gone."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MediaPolicy:
    """What of the media is sent in full: the last ``keep_turns`` user turns, within the caps."""

    keep_turns: int = 2
    max_parts: int = 20
    max_tokens: int = 16_000
    max_request_bytes: int = 20_000_000
    load: Loader | None = None


def age_parts(parts: Sequence[Any], aged: Iterable[int]) -> tuple[Any, ...]:
    """The parts with those at the ``aged`` positions replaced by their placeholders."""
    gone = set(aged)
    return tuple(
        placeholder_part(part) if index in gone and kind_of(part) else part
        for index, part in enumerate(parts)
    )


def media_positions(parts: Sequence[Any] | None) -> list[int]:
    """The positions of the media parts among a message's parts."""
    return [index for index, part in enumerate(parts or ()) if kind_of(part)]


def strip_meta(part: Any) -> Any:
    """A part as a provider takes it: without Recap's key."""
    if isinstance(part, Mapping) and META_KEY in part:
        return {k: v for k, v in part.items() if k != META_KEY}
    return part


def sent_bytes(part: Mapping[str, Any]) -> int:
    """The length of a part's data field once its stored bytes are put back."""
    meta = meta_of(part)
    if ref_of(part) is not None and meta.get("bytes"):
        encoded = 4 * math.ceil(int(meta["bytes"]) / 3)
        prefix = 0 if meta.get("kind") == AUDIO else len(f"data:{meta.get('type')};base64,")
        return prefix + encoded
    return len(data_of(part) or "")


def data_field(meta: Mapping[str, Any], encoded: str) -> str:
    """A part's data field rebuilt from its stored base64: a data URL, or the base64 itself for
    audio."""
    if meta.get("kind") == AUDIO:
        return encoded
    return f"data:{meta.get('type') or 'application/octet-stream'};base64,{encoded}"
