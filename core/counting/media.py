"""Media in messages (pure): images, audio and files read from their headers, counted by the
provider family's published rule, described as text, and aged into placeholders.

A content part is media when its ``type`` is ``image_url``, ``input_audio`` or ``file`` (OpenAI's
chat format, which litellm translates for every provider). On ingest each media part is checked
(``check_part``) and gets a ``_media`` object that Recap computes itself (kind, type, name, size,
width and height, the stored copy's content name), whatever the input said under that key. The
bytes are never decoded beyond their header: PNG, JPEG (a scan for the SOF marker), GIF and WebP
(VP8, VP8L, VP8X) give their size in a few bytes, and a remote URL is never fetched.

Counting (``part_tokens``) follows the family of the conversation's model (``family_of``):

- OpenAI: ``detail: low`` is a fixed base; ``high`` (and ``auto``, counted as ``high``, the more
  expensive reading) scales the image to fit 2048 x 2048, then its shortest side down to 768, and
  adds a per-tile cost for each 512-px tile. The base and tile cost depend on the model (85/170
  for GPT-4o and GPT-4.1, 2833/5667 for GPT-4o mini, 75/150 for o1/o3, 70/140 for GPT-5).
- Anthropic: ``ceil(width x height / 750)`` after scaling the long edge down to 1568 px and the
  image down to about 1,600 tokens.
- Gemini: 258 tokens for an image within 384 x 384, else 258 per 768 x 768 tile.
- An image whose size is unknown (a remote URL, a header that cannot be read) is counted as
  ``UNKNOWN_IMAGE_TOKENS``, the upper end of the rules above for one image.
- Audio: ``AUDIO_TOKENS_PER_SECOND`` per second (WAV duration from its header, otherwise from the
  byte size at ``AUDIO_BYTES_PER_SECOND``). Files: ``FILE_TOKENS_PER_PAGE`` per PDF page (pages
  counted from the ``/Type /Page`` objects), otherwise one token per ``FILE_BYTES_PER_TOKEN``
  bytes; a file known only by id counts as ``UNKNOWN_FILE_TOKENS``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import re
import struct
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from core.errors import InputError

log = structlog.get_logger(__name__)

IMAGE, AUDIO, FILE = "image", "audio", "file"
PART_KINDS = {"image_url": IMAGE, "input_audio": AUDIO, "file": FILE}
META_KEY = "_media"  # the key Recap computes on each media part; never taken from input
REF_SCHEME = "recap-media:"  # a stored part's data field says where its bytes went: this + name
REF_RE = re.compile(r"^recap-media:([0-9a-f]{32})$")

IMAGE_TYPES = {"image/png", "image/jpeg", "image/gif", "image/webp"}  # what every vision API takes
AUDIO_FORMATS = {"wav", "mp3", "flac", "ogg", "opus", "aac", "m4a", "webm", "pcm16"}
FILE_TYPES = {"application/pdf", "text/plain", "text/markdown", "text/csv", "application/json"}
EXTENSIONS = {
    "image/png": "png",
    "image/jpeg": "jpg",
    "image/gif": "gif",
    "image/webp": "webp",
    "application/pdf": "pdf",
    "text/plain": "txt",
    "text/markdown": "md",
    "text/csv": "csv",
    "application/json": "json",
}
DATA_URL_RE = re.compile(r"^data:([\w.+-]+/[\w.+-]+)((?:;[\w.+-]+=[^;,]*)*);base64,(.*)$", re.S)

OPENAI, ANTHROPIC, GEMINI = "openai", "anthropic", "gemini"
DEFAULT_FAMILY = OPENAI  # OpenAI-compatible servers are the common case behind a litellm string

# OpenAI, "Images and vision" guide, "Calculating costs": (base, per 512-px tile) by model.
OPENAI_TILE_COSTS: tuple[tuple[str, tuple[int, int]], ...] = (
    ("gpt-4o-mini", (2833, 5667)),
    ("gpt-5", (70, 140)),
    ("o1", (75, 150)),
    ("o3", (75, 150)),
)
OPENAI_DEFAULT_COSTS = (85, 170)  # GPT-4o, GPT-4.1, GPT-4.5 and the guide's worked examples
OPENAI_BOX = 2048  # first fit within 2048 x 2048
OPENAI_SHORT_SIDE = 768  # then the shortest side is scaled down to 768
OPENAI_TILE = 512
ANTHROPIC_LONG_EDGE = 1568  # Anthropic's vision guide: a longer edge is scaled down first
ANTHROPIC_MAX_TOKENS = 1600  # ... as is an image of more than about 1,600 tokens
ANTHROPIC_PIXELS_PER_TOKEN = 750  # tokens = width x height / 750
GEMINI_SMALL = 384  # Gemini: an image within 384 x 384 is one block
GEMINI_TILE = 768  # a larger one is cut into 768 x 768 tiles
GEMINI_TOKENS = 258  # per block or tile
UNKNOWN_IMAGE_TOKENS = 1600  # size unknown: the most one image costs under the rules above
AUDIO_TOKENS_PER_SECOND = 32  # Gemini's published audio rate; OpenAI's audio models are lower
AUDIO_BYTES_PER_SECOND = 16_000  # a compressed format's duration estimated at 128 kbit/s
UNKNOWN_AUDIO_TOKENS = 960  # no data: assumed half a minute
FILE_TOKENS_PER_PAGE = 1_500  # Anthropic's PDF guide: 1,500-3,000 text tokens a page, low end
FILE_BYTES_PER_TOKEN = 4  # a text file: about four bytes per token
UNKNOWN_FILE_TOKENS = 3_000  # a file known by id only: assumed two pages
PDF_PAGE_RE = re.compile(rb"/Type\s*/Page(?![s\w])")
HEADER_SCAN_BYTES = 1 << 20  # a JPEG's SOF marker is found within its first MiB in practice
SHORT_DIGEST_CHARS = 8  # an unnamed part is called by its kind and these digits of its hash
NAME_CHARS = 80  # a media name shown in a placeholder is cut here
PLACEHOLDER = "[{kind}: {label}, removed to save context]"
UNAVAILABLE = "[{kind}: {label}, its stored copy is no longer available]"
_logged: set[str] = set()


class MediaError(InputError):
    """A media part that cannot be stored: malformed, of an unsupported type, or without data."""


# --- headers -----------------------------------------------------------------------------------


def image_size(data: bytes) -> tuple[int, int] | None:
    """Width and height from an image's header (PNG, JPEG, GIF, WebP), or None."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR":
        width, height = struct.unpack(">II", data[16:24])
        return width, height
    if data[:6] in (b"GIF87a", b"GIF89a"):
        width, height = struct.unpack("<HH", data[6:10])
        return width, height
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp_size(data)
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and data[20:21] == b"\x2f":
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return width, height
    return None


_SOF_MARKERS = frozenset(
    {*range(0xC0, 0xC4), *range(0xC5, 0xC8), *range(0xC9, 0xCC), 0xCD, 0xCE, 0xCF}
)
_STANDALONE = frozenset({0x01, *range(0xD0, 0xDA)})  # markers without a length field


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """Scan the marker segments for a start-of-frame; no entropy-coded data is read."""
    index, end = 2, min(len(data), HEADER_SCAN_BYTES)
    while index + 4 <= end:
        if data[index] != 0xFF:
            return None
        marker = data[index + 1]
        if marker == 0xFF:  # fill byte
            index += 1
            continue
        if marker in _STANDALONE:
            index += 2
            continue
        if marker in _SOF_MARKERS and index + 9 <= len(data):
            height, width = struct.unpack(">HH", data[index + 5 : index + 9])
            return (width, height) if width and height else None
        index += 2 + int.from_bytes(data[index + 2 : index + 4], "big")
    return None


def wav_seconds(data: bytes) -> float | None:
    """A WAV file's duration from its ``fmt `` and ``data`` chunk headers, or None."""
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    index, rate = 12, 0
    while index + 8 <= len(data):
        chunk, size = data[index : index + 4], int.from_bytes(data[index + 4 : index + 8], "little")
        if chunk == b"fmt " and index + 16 <= len(data):
            rate = int.from_bytes(data[index + 16 : index + 20], "little")  # bytes per second
        elif chunk == b"data":
            return size / rate if rate else None
        index += 8 + size + (size & 1)
    return None


# --- parts -------------------------------------------------------------------------------------


def kind_of(part: Any) -> str | None:
    """``image``, ``audio`` or ``file`` for a media part, None for anything else."""
    if isinstance(part, Mapping):
        return PART_KINDS.get(str(part.get("type")))
    return None


def has_media(content: Any) -> bool:
    """Whether a message's content holds any media part."""
    return isinstance(content, list | tuple) and any(kind_of(part) for part in content)


def _field(part: Mapping[str, Any]) -> tuple[str, str]:
    """The object and key under which a part's data (or URL) lives."""
    kind = kind_of(part)
    if kind == IMAGE:
        return "image_url", "url"
    if kind == AUDIO:
        return "input_audio", "data"
    return "file", "file_data"


def data_of(part: Mapping[str, Any]) -> str | None:
    """The part's data field: a data URL, a remote URL, raw base64 (audio) or a stored ref."""
    outer, key = _field(part)
    holder = part.get(outer)
    if kind_of(part) == IMAGE and isinstance(holder, str):
        return holder  # the short form {"type": "image_url", "image_url": "https://..."}
    if isinstance(holder, Mapping) and isinstance(holder.get(key), str):
        return str(holder[key])
    return None


def with_data(part: Mapping[str, Any], value: str) -> dict[str, Any]:
    """A copy of the part with its data field set to ``value`` (Recap's key left out)."""
    outer, key = _field(part)
    holder = part.get(outer)
    inner = {key: value} if isinstance(holder, str) else {**dict(holder or {}), key: value}
    return {**{k: v for k, v in part.items() if k != META_KEY}, outer: inner}


def parse_data_url(url: str, where: str) -> tuple[str, bytes]:
    """The media type and bytes of a base64 data URL, or a ``MediaError`` naming ``where``."""
    match = DATA_URL_RE.match(url)
    if match is None:
        raise MediaError(f"{where}: malformed data URL (expected data:<type>;base64,<data>)")
    return match.group(1).lower(), _b64(match.group(3), where)


def _b64(text: str, where: str) -> bytes:
    try:
        data = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise MediaError(f"{where}: the base64 data is malformed") from None
    if not data:
        raise MediaError(f"{where}: the part has no data")
    return data


@dataclass(frozen=True, slots=True)
class Checked:
    """One media part as ingest sees it: Recap's metadata, and its inline bytes (if any)."""

    meta: dict[str, Any]
    data: bytes | None


def check_part(part: Mapping[str, Any], where: str) -> Checked:
    """A media part checked and described, or a ``MediaError`` naming ``where``."""
    kind = kind_of(part)
    value = data_of(part)
    if kind == FILE and value is None:
        holder = part.get("file")
        file_id = holder.get("file_id") if isinstance(holder, Mapping) else None
        if isinstance(file_id, str) and file_id:
            return Checked({"kind": FILE, "name": _cut(file_id), "file_id": True}, None)
    if not value:
        raise MediaError(f"{where}: the {kind} part has no data")
    if REF_RE.match(value):
        raise MediaError(
            f"{where}: {value} is a stored reference, not data; export with --full to get the bytes"
        )
    if kind == AUDIO:
        return _check_audio(part, value, where)
    if value.startswith("data:"):
        mime, data = parse_data_url(value, where)
        return Checked(_inline_meta(kind or FILE, mime, data, part, where), data)
    if kind == IMAGE and value.startswith(("http://", "https://")):
        return Checked({"kind": IMAGE, "name": _url_name(value), "detail": _detail(part)}, None)
    raise MediaError(f"{where}: a {kind} part needs a base64 data URL or an http(s) URL")


def _check_audio(part: Mapping[str, Any], value: str, where: str) -> Checked:
    audio = part.get("input_audio")
    fmt = str(audio.get("format", "")).lower() if isinstance(audio, Mapping) else ""
    if fmt not in AUDIO_FORMATS:
        raise MediaError(f"{where}: unsupported audio format {fmt!r}")
    data = _b64(value, where)
    seconds = wav_seconds(data) if fmt == "wav" else None
    if seconds is None:
        seconds = len(data) / AUDIO_BYTES_PER_SECOND
    meta = {"kind": AUDIO, "type": f"audio/{fmt}", "bytes": len(data), "seconds": round(seconds, 2)}
    meta["name"] = _given_name(part) or f"audio-{_short_digest(data)}.{fmt}"
    return Checked(meta, data)


def _inline_meta(
    kind: str, mime: str, data: bytes, part: Mapping[str, Any], where: str
) -> dict[str, Any]:
    allowed = IMAGE_TYPES if kind == IMAGE else FILE_TYPES | IMAGE_TYPES
    if mime not in allowed:
        raise MediaError(f"{where}: unsupported {kind} type {mime}")
    meta: dict[str, Any] = {"kind": kind, "type": mime, "bytes": len(data)}
    name = _given_name(part)
    if mime in IMAGE_TYPES:
        size = image_size(data)
        if size is not None:
            meta["width"], meta["height"] = size
        else:
            _log_once("media_header_unreadable", where=where, type=mime)
    if mime == "application/pdf":
        meta["pages"] = max(len(PDF_PAGE_RE.findall(data)), 1)
    if kind == IMAGE:
        meta["detail"] = _detail(part)
    meta["name"] = name or f"{kind}-{_short_digest(data)}.{EXTENSIONS.get(mime, 'bin')}"
    return meta


def _short_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:SHORT_DIGEST_CHARS]


def _detail(part: Mapping[str, Any]) -> str:
    holder = part.get("image_url")
    detail = holder.get("detail") if isinstance(holder, Mapping) else None
    return str(detail) if detail in ("low", "high", "auto") else "auto"


def _given_name(part: Mapping[str, Any]) -> str | None:
    """A name the part itself carries: a file's ``filename``, or a ``name`` on the part."""
    for holder in (part.get("file"), part.get("image_url"), part.get("input_audio"), part):
        if isinstance(holder, Mapping):
            for key in ("filename", "name"):
                value = holder.get(key)
                if isinstance(value, str) and value.strip():
                    return _cut(value.strip())
    return None


def _url_name(url: str) -> str:
    path = url.split("?", 1)[0].split("#", 1)[0].rstrip("/")
    return _cut(path.rsplit("/", 1)[-1] or url)


def _cut(name: str) -> str:
    flat = " ".join(name.split())
    return flat if len(flat) <= NAME_CHARS else flat[: NAME_CHARS - 3] + "..."


def _log_once(event: str, **fields: Any) -> None:
    key = f"{event}:{sorted(fields.items())}"
    if key not in _logged:
        _logged.add(key)
        log.warning(event, **fields)


def meta_of(part: Any) -> Mapping[str, Any]:
    """Recap's metadata on a stored part (empty for a part stored before it was computed)."""
    if isinstance(part, Mapping) and isinstance(part.get(META_KEY), Mapping):
        return part[META_KEY]  # type: ignore[no-any-return]
    return {}


def ref_of(part: Mapping[str, Any]) -> str | None:
    """The content name of the stored bytes of a part, when they are stored out of the row."""
    match = REF_RE.match(data_of(part) or "")
    return match.group(1) if match else None


# --- counting ----------------------------------------------------------------------------------


def family_of(model: str | None) -> str:
    """The provider family whose image rule applies to a litellm model string."""
    name = (model or "").lower()
    if name.startswith("anthropic/") or "claude" in name:
        return ANTHROPIC
    if name.startswith(("gemini/", "vertex_ai/gemini")) or "gemini" in name:
        return GEMINI
    return OPENAI


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
        family=family_of(model),
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


# --- text --------------------------------------------------------------------------------------


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


# --- the request -------------------------------------------------------------------------------


Loader = Callable[[str], str | None]
"""Gives a stored part's base64 text back by its content name, or None when it is gone."""


@dataclass(frozen=True, slots=True)
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


# --- ageing ------------------------------------------------------------------------------------

TURNS, CAP, BYTES, TEXT_ONLY = "turns", "cap", "bytes", "text-only"
RECORDED = "media"  # the clearing reason of a message whose media all renders as placeholders


@dataclass(frozen=True, slots=True)
class AgeingPlan:
    """Which media parts of which messages are sent as placeholders, and why."""

    aged: dict[int, frozenset[int]]  # message id -> positions of its aged parts
    reasons: dict[int, str]


def plan_ageing(
    messages: Sequence[Any],
    *,
    policy: MediaPolicy,
    model: str | None,
    recorded: Iterable[int] = (),
    text_only: bool = False,
) -> AgeingPlan:
    """Media older than the last ``keep_turns`` user turns, of a message already recorded as
    aged, or beyond the caps (the newest parts are kept, counting back until one does not fit:
    a contiguous newest run) is aged. ``messages`` are ``Msg`` rows after the summary's cutoff,
    oldest first; a text-only request ages every part."""
    done = set(recorded)
    starts = [i for i, m in enumerate(messages) if m.role == "user"]
    if text_only or policy.keep_turns == 0:
        keep_from = len(messages)
    elif len(starts) >= policy.keep_turns:
        keep_from = starts[-policy.keep_turns]
    else:
        keep_from = 0
    aged: dict[int, set[int]] = {}
    reasons: dict[int, str] = {}
    full: list[tuple[int, int, Any]] = []  # message id, position, part: newest last
    for index, message in enumerate(messages):
        positions = media_positions(message.content_parts)
        if not positions:
            continue
        if index < keep_from or message.id in done:
            aged[message.id] = set(positions)
            reasons[message.id] = TEXT_ONLY if text_only else TURNS
            continue
        full.extend((message.id, p, message.content_parts[p]) for p in positions)
    parts = tokens = 0
    over = False
    for mid, position, part in reversed(full):
        cost = part_tokens(part, model)
        over = over or parts + 1 > policy.max_parts or tokens + cost > policy.max_tokens
        if over:
            aged.setdefault(mid, set()).add(position)
            reasons.setdefault(mid, CAP)
        else:
            parts, tokens = parts + 1, tokens + cost
    return AgeingPlan({k: frozenset(v) for k, v in aged.items()}, reasons)


Counter = Callable[[Mapping[str, Any]], int]


@dataclass(frozen=True, slots=True)
class Finished:
    """The request's messages as sent, with what the media in them costs."""

    messages: list[dict[str, Any]]
    media_tokens: int  # of the parts sent in full after the system prompt
    tokens_delta: int  # what the byte guard and missing stored copies changed (<= 0)
    aged_by_bytes: int  # parts the byte guard sent as placeholders


def finish(
    messages: list[dict[str, Any]],
    policy: MediaPolicy,
    *,
    model: str | None,
    count: Counter,
    keep: Collection[int] = (),
) -> Finished:
    """Apply the byte guard (the oldest media first, until the request is within
    ``max_request_bytes``; the media of the messages at the positions ``keep`` names, pinned
    ones, only once no other is left), put the stored bytes back, and take Recap's key off every
    part."""
    out = list(messages)
    spots = [
        (i, p)
        for i, message in enumerate(out)
        if isinstance(message.get("content"), list)
        for p in media_positions(message["content"])
    ]
    if not spots:
        return Finished(out, 0, 0, 0)
    delta = aged = 0
    kept = set(keep)
    order = iter(sorted(spots, key=lambda spot: spot[0] in kept) if kept else spots)
    while request_bytes(out) > policy.max_request_bytes:
        spot = next(order, None)
        if spot is None:
            break
        delta += _replace(out, spot, count, unavailable=False)
        aged += 1
    media = 0
    for index, position in spots:
        part = out[index]["content"][position]
        if not kind_of(part):
            continue
        ref = ref_of(part)
        value = policy.load(ref) if ref is not None and policy.load is not None else None
        if ref is not None and value is None:
            delta += _replace(out, (index, position), count, unavailable=True)
            continue
        if index > 0 or out[0].get("role") not in ("system", "developer"):
            media += part_tokens(part, model)
        if value is not None:
            _set_part(out, (index, position), with_data(part, data_field(meta_of(part), value)))
    for index in {i for i, _ in spots}:
        out[index] = {**out[index], "content": [strip_meta(p) for p in out[index]["content"]]}
    return Finished(out, media, delta, aged)


def request_bytes(messages: Sequence[Mapping[str, Any]]) -> int:
    """The JSON size of the messages with every stored part's bytes put back."""
    import json

    size = len(json.dumps(list(messages), ensure_ascii=False).encode("utf-8"))
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                if kind_of(part) and ref_of(part) is not None:
                    size += sent_bytes(part) - len(data_of(part) or "")
    return size


def _set_part(out: list[dict[str, Any]], spot: tuple[int, int], part: Any) -> None:
    index, position = spot
    content = list(out[index]["content"])
    content[position] = part
    out[index] = {**out[index], "content": content}


def _replace(
    out: list[dict[str, Any]], spot: tuple[int, int], count: Counter, *, unavailable: bool
) -> int:
    """Send one part as its placeholder; the tokens this changes."""
    before = count(out[spot[0]])
    part = out[spot[0]]["content"][spot[1]]
    _set_part(out, spot, placeholder_part(part, unavailable=unavailable))
    return count(out[spot[0]]) - before


def check_parts(content: Sequence[Any], where: str) -> None:
    """Every media part of a message's content is storable: one ``MediaError`` naming the first
    that is not (the message and the part's position)."""
    for index, part in enumerate(content):
        if isinstance(part, Mapping) and any(str(key).startswith("_") for key in part):
            raise MediaError(f"{where} part {index}: keys starting with '_' are Recap's own")
        if kind_of(part):
            check_part(part, f"{where} part {index}")
