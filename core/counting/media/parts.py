"""Media parts on ingest: recognized, checked, and given the ``_media`` object Recap computes itself
(kind, type, name, size, width and height, the stored copy's content name)."""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from recap.core.counting.media.headers import image_size, wav_seconds
from recap.core.counting.media.kinds import (
    AUDIO,
    AUDIO_BYTES_PER_SECOND,
    AUDIO_FORMATS,
    DATA_URL_RE,
    EXTENSIONS,
    FILE,
    FILE_TYPES,
    IMAGE,
    IMAGE_TYPES,
    META_KEY,
    NAME_CHARS,
    PART_KINDS,
    PDF_PAGE_RE,
    REF_RE,
    SHORT_DIGEST_CHARS,
    MediaError,
    _logged,
    log,
)


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
