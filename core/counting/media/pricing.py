"""Media counted by the provider family's published rule (``part_tokens``; see the package's
docstring for each rule)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from recap.core.counting import providers
from recap.core.counting.media.kinds import (
    ANTHROPIC,
    ANTHROPIC_LONG_EDGE,
    ANTHROPIC_MAX_TOKENS,
    ANTHROPIC_PIXELS_PER_TOKEN,
    AUDIO,
    AUDIO_TOKENS_PER_SECOND,
    FILE,
    FILE_BYTES_PER_TOKEN,
    FILE_TOKENS_PER_PAGE,
    GEMINI,
    GEMINI_SMALL,
    GEMINI_TILE,
    GEMINI_TOKENS,
    IMAGE_TYPES,
    OPENAI,
    OPENAI_BOX,
    OPENAI_DEFAULT_COSTS,
    OPENAI_SHORT_SIDE,
    OPENAI_TILE,
    OPENAI_TILE_COSTS,
    UNKNOWN_AUDIO_TOKENS,
    UNKNOWN_FILE_TOKENS,
    UNKNOWN_IMAGE_TOKENS,
    MediaError,
)
from recap.core.counting.media.parts import _detail, _log_once, check_part, kind_of, meta_of


def image_rule_of(model: str | None) -> str:
    """Whose image rule applies to a litellm model string: Anthropic's, Gemini's or OpenAI's
    (every other provider's images are counted by OpenAI's rule)."""
    provider = providers.provider_of(model)
    return provider if provider in (ANTHROPIC, GEMINI) else OPENAI


def openai_image_tokens(
    width: int | None, height: int | None, detail: str = "auto", model: str | None = None
) -> int:
    """OpenAI's rule: a fixed base at ``low``; at ``high`` (and ``auto``) base plus tiles."""
    base, per_tile = _openai_costs(model)
    if detail == "low":
        return base
    if not width or not height:
        return UNKNOWN_IMAGE_TOKENS
    w, h = float(width), float(height)
    if max(w, h) > OPENAI_BOX:
        scale = OPENAI_BOX / max(w, h)
        w, h = w * scale, h * scale
    if min(w, h) > OPENAI_SHORT_SIDE:
        scale = OPENAI_SHORT_SIDE / min(w, h)
        w, h = w * scale, h * scale
    tiles = math.ceil(round(w) / OPENAI_TILE) * math.ceil(round(h) / OPENAI_TILE)
    return base + per_tile * tiles


def _openai_costs(model: str | None) -> tuple[int, int]:
    name = (model or "").rsplit("/", 1)[-1].lower()
    for prefix, costs in OPENAI_TILE_COSTS:
        if name.startswith(prefix):
            return costs
    return OPENAI_DEFAULT_COSTS


def anthropic_image_tokens(width: int | None, height: int | None) -> int:
    """Anthropic's rule: width x height / 750 after its long-edge and size limits."""
    if not width or not height:
        return UNKNOWN_IMAGE_TOKENS
    w, h = float(width), float(height)
    if max(w, h) > ANTHROPIC_LONG_EDGE:
        scale = ANTHROPIC_LONG_EDGE / max(w, h)
        w, h = w * scale, h * scale
    return min(math.ceil(round(w) * round(h) / ANTHROPIC_PIXELS_PER_TOKEN), ANTHROPIC_MAX_TOKENS)


def gemini_image_tokens(width: int | None, height: int | None) -> int:
    """Gemini's rule: one block within 384 x 384, else one per 768 x 768 tile."""
    if not width or not height:
        return UNKNOWN_IMAGE_TOKENS
    if width <= GEMINI_SMALL and height <= GEMINI_SMALL:
        return GEMINI_TOKENS
    return GEMINI_TOKENS * math.ceil(width / GEMINI_TILE) * math.ceil(height / GEMINI_TILE)


def image_tokens(
    width: int | None, height: int | None, *, family: str, detail: str = "auto", model: str = ""
) -> int:
    """One image's tokens under its provider family's rule."""
    if family == ANTHROPIC:
        return anthropic_image_tokens(width, height)
    if family == GEMINI:
        return gemini_image_tokens(width, height)
    return openai_image_tokens(width, height, detail, model)


def part_tokens(part: Mapping[str, Any], model: str | None = None) -> int:
    """Tokens one media part costs sent in full to ``model`` (its family's rule)."""
    meta = meta_of(part) or _meta_now(part)
    kind = meta.get("kind") or kind_of(part)
    if kind == AUDIO:
        seconds = meta.get("seconds")
        return math.ceil(seconds * AUDIO_TOKENS_PER_SECOND) if seconds else UNKNOWN_AUDIO_TOKENS
    if kind == FILE:
        return _file_tokens(meta)
    return image_tokens(
        meta.get("width"),
        meta.get("height"),
        family=image_rule_of(model),
        detail=str(meta.get("detail") or _detail(part)),
        model=model or "",
    )


def _file_tokens(meta: Mapping[str, Any]) -> int:
    if meta.get("pages"):
        return int(meta["pages"]) * FILE_TOKENS_PER_PAGE
    if meta.get("type") in IMAGE_TYPES:
        return anthropic_image_tokens(meta.get("width"), meta.get("height"))
    if meta.get("bytes"):
        return math.ceil(int(meta["bytes"]) / FILE_BYTES_PER_TOKEN)
    return UNKNOWN_FILE_TOKENS


def _meta_now(part: Mapping[str, Any]) -> dict[str, Any]:
    """Metadata of a part that has none stored (counted straight from input): its header."""
    try:
        return check_part(part, "part").meta
    except MediaError:
        _log_once("media_part_unreadable", type=str(part.get("type")))
        return {"kind": kind_of(part)}
