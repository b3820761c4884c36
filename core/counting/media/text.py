"""Media described as text: labels, placeholders, captions, and a message's text with its media."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from recap.core.counting.media.kinds import PLACEHOLDER, UNAVAILABLE
from recap.core.counting.media.parts import _cut, kind_of, meta_of


def label(meta: Mapping[str, Any]) -> str:
    """What a placeholder or a summary calls a media part: its name and size."""
    bits = [str(meta.get("name") or meta.get("kind") or "media")]
    if meta.get("width") and meta.get("height"):
        bits.append(f"{meta['width']}x{meta['height']}")
    if meta.get("seconds"):
        bits.append(f"{meta['seconds']:g} s")
    if meta.get("pages"):
        bits.append(f"{meta['pages']} pages")
    return ", ".join(bits)


def placeholder(part: Mapping[str, Any], *, unavailable: bool = False) -> str:
    """The fixed text a media part is sent as once aged (the same part gives the same bytes)."""
    meta = meta_of(part) or {"kind": kind_of(part)}
    template = UNAVAILABLE if unavailable else PLACEHOLDER
    return template.format(kind=meta.get("kind") or "media", label=label(meta))


def placeholder_part(part: Mapping[str, Any], *, unavailable: bool = False) -> dict[str, Any]:
    """A media part as the text part that replaces it."""
    return {"type": "text", "text": placeholder(part, unavailable=unavailable)}


def describe(part: Mapping[str, Any]) -> str:
    """A media part as the summarizer reads it: kind, name, size, and any caption it carries."""
    meta = meta_of(part) or {"kind": kind_of(part)}
    text = f"[{meta.get('kind') or 'media'}: {label(meta)}"
    caption = _caption(part)
    return text + (f'; caption: "{caption}"]' if caption else "]")


def _caption(part: Mapping[str, Any]) -> str | None:
    for holder in (part, part.get("image_url")):
        if isinstance(holder, Mapping):
            for key in ("alt", "caption", "alt_text"):
                value = holder.get(key)
                if isinstance(value, str) and value.strip():
                    return _cut(value.strip())
    return None


def names(parts: Iterable[Any]) -> list[str]:
    """The names of the media parts among ``parts`` (for identifier retention)."""
    found = []
    for part in parts:
        if kind_of(part):
            name = meta_of(part).get("name")
            if isinstance(name, str) and name:
                found.append(name)
    return found


def parts_text(parts: Sequence[Any]) -> str:
    """A list of parts as plain text: text parts as they are, media as their descriptions."""
    lines = []
    for part in parts:
        if kind_of(part):
            lines.append(describe(part))
        elif isinstance(part, Mapping):
            lines.append(str(part.get("text", "[non-text part]")))
        else:
            lines.append(str(part))
    return "\n".join(lines)


def text_of(content: str | None, parts: Sequence[Any] | None) -> str:
    """A message's own words: its string content, or its text parts (media left out)."""
    if parts is None:
        return content or ""
    texts = [part for part in parts if isinstance(part, Mapping) and not kind_of(part)]
    return "\n".join(str(part.get("text", "")) for part in texts)
