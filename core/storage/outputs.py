"""Full tool outputs on disk: written on ingest, read back by ``export --full``, expired by cleanup.

Files live under ``RECAP_OUTPUT_DIR`` as ``<2 hex>/<32 hex>.txt``, named by the SHA-256 of their
content (the same output is stored once), mode 0600 in 0700 folders. A file is written to a
temporary name and renamed into place, so a reader never sees half of one. The cleanup deletes
regular files older than the retention and nothing else: it never follows a symbolic link, and a
file that vanished meanwhile (another cleanup) is simply skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from recap.core.counting import media
from recap.core.errors import InputError
from recap.core.request.truncation import (
    Limits,
    byte_size,
    is_oversized,
    output_preview,
    trim_arguments,
)
from recap.core.settings import Settings
from recap.core.storage import private
from recap.core.storage.store import Prepared
from recap.core.values.records import Msg

DIGEST_CHARS = 32  # 128 bits of SHA-256: collisions are out of reach, and names stay short
SUFFIX = ".txt"
TEMP_PREFIX = ".tmp-"
MEDIA_INLINE_BYTES = 32_768  # the settings' default: a thumbnail stays in the row, a screenshot not
NAME_RE = re.compile(f"[0-9a-f]{{{DIGEST_CHARS}}}")  # the only file names Recap builds
READ_CHUNK = 1 << 20  # bytes per read of a saved file
# A saved file is opened by the path Recap builds, never through a link, and a FIFO found there
# does not block the open (it is then refused as not a regular file).
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC

log = structlog.get_logger(__name__)


def digest_of(data: bytes) -> str:
    """The content name of a file."""
    return hashlib.sha256(data).hexdigest()[:DIGEST_CHARS]


def _private_folder(folder: Path) -> None:
    if not folder.is_dir():
        private.make_folder(folder)  # the folders above it too (``.recap/``)


@dataclass
class WriteJournal:
    """The files one unit of work (an import, an add) created or refreshed, so a unit that fails
    can take them back: created files are deleted, refreshed ones get their old times again.
    Files that were there before the unit are never deleted, nor a created file that another
    writer has refreshed since (its time moved on: someone else now uses it)."""

    created: list[tuple[Path, int]] = field(default_factory=list)  # path, mtime once written
    refreshed: list[tuple[Path, int, int]] = field(default_factory=list)  # path, atime, mtime

    def undo(self) -> None:
        """Delete what the unit created and restore the times of what it refreshed."""
        for path, mtime_ns in reversed(self.created):
            try:
                if os.stat(path, follow_symlinks=False).st_mtime_ns == mtime_ns:
                    path.unlink()
            except FileNotFoundError:
                continue
        for path, atime_ns, mtime_ns in self.refreshed:
            try:
                os.utime(path, ns=(atime_ns, mtime_ns), follow_symlinks=False)
            except FileNotFoundError:
                continue
        self.created.clear()
        self.refreshed.clear()


def save_output(root: Path, text: str, journal: WriteJournal | None = None) -> Path:
    """Write a full output under ``root`` by its content hash; returns its absolute path.

    Writing the same text again only refreshes the file's time, so the retention counts from the
    latest use. Raises ``OSError`` when the folder cannot be written. ``journal`` records the
    file as created or refreshed.
    """
    data = text.encode("utf-8")
    name = digest_of(data)
    base = Path(os.path.abspath(root))
    folder = base / name[:2]
    _private_folder(base)
    _private_folder(folder)
    path = folder / f"{name}{SUFFIX}"
    try:
        info = os.stat(path, follow_symlinks=False)
        if stat.S_ISREG(info.st_mode) and info.st_size == len(data):
            os.utime(path)
            if journal is not None:
                journal.refreshed.append((path, info.st_atime_ns, info.st_mtime_ns))
            return path
    except FileNotFoundError:
        pass
    handle, temporary = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=folder)  # created 0600
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    if journal is not None:
        journal.created.append((path, os.stat(path, follow_symlinks=False).st_mtime_ns))
    return path


def saved_path(root: Path, name: str) -> Path:
    """Where the output named ``name`` (its content hash) is saved under ``root``."""
    return Path(os.path.abspath(root)) / name[:2] / f"{name}{SUFFIX}"


def saved_name(path: str | None, root: Path) -> str | None:
    """The content name of ``path`` when it is exactly a path Recap builds under ``root``
    (``<root>/<2 hex>/<32 hex>.txt``), else None: any other path is never opened."""
    if not path:
        return None
    name = os.path.basename(path).removesuffix(SUFFIX)
    if NAME_RE.fullmatch(name) is None or str(saved_path(root, name)) != path:
        return None
    return name


def _open_saved(root: Path, name: str) -> tuple[int, int] | None:
    """A descriptor and the size of the regular file saved as ``name`` under ``root``, or None.

    ``root`` may itself be a link (as for the cleanup); below it nothing is followed: the
    subfolder and the file are opened relative to their folders with ``O_NOFOLLOW``, and a link,
    FIFO, device or folder in their place is refused.
    """
    try:
        base = os.open(os.path.abspath(root), FOLDER_FLAGS)
    except OSError:
        return None
    try:
        folder = os.open(name[:2], FOLDER_FLAGS | os.O_NOFOLLOW, dir_fd=base)
        try:
            info = os.stat(f"{name}{SUFFIX}", dir_fd=folder, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode):
                return None
            handle = os.open(f"{name}{SUFFIX}", FILE_FLAGS, dir_fd=folder)
        finally:
            os.close(folder)
    except OSError:
        return None
    finally:
        os.close(base)
    info = os.fstat(handle)
    if not stat.S_ISREG(info.st_mode):  # replaced between the check and the open
        os.close(handle)
        return None
    return handle, info.st_size


def _read_at_most(handle: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(handle, min(READ_CHUNK, left))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_saved(root: Path, name: str, size: int | None = None) -> str | None:
    """The text saved as ``name`` under ``root``, or None when it is gone, is not a regular file,
    is not ``size`` bytes (when given: at most that much is read), or does not match its name."""
    if NAME_RE.fullmatch(name) is None:
        return None
    opened = _open_saved(root, name)
    if opened is None:
        return None
    handle, actual = opened
    try:
        if size is not None and actual != size:
            log.warning("saved_output_size_mismatch", name=name, recorded=size, found=actual)
            return None
        data = _read_at_most(handle, actual if size is None else size)
    finally:
        os.close(handle)
    if digest_of(data) != name:
        log.warning("saved_output_mismatch", name=name)
        return None
    return data.decode("utf-8", errors="replace")


def read_output(
    path: str | None, *, root: Path | None = None, size: int | None = None
) -> str | None:
    """The saved text at ``path`` when it is a path Recap built under ``root`` (default:
    ``RECAP_OUTPUT_DIR``), read as ``read_saved`` does; None for any other path, unopened."""
    folder = _output_root(root)
    name = saved_name(path, folder)
    return None if name is None else read_saved(folder, name, size)


def output_exists(path: str | None, root: Path | None = None) -> bool:
    """Whether a saved output is still there (a cleared result's placeholder says so). Only a
    path Recap built under ``root`` (default: ``RECAP_OUTPUT_DIR``) is looked at: any other path
    reads as gone, whether or not something is there, so the answer reveals nothing about it."""
    folder = _output_root(root)
    name = saved_name(path, folder)
    opened = None if name is None else _open_saved(folder, name)
    if opened is None:
        return False
    os.close(opened[0])
    return True


def _output_root(root: Path | None) -> Path:
    if root is not None:
        return root
    from recap.core.settings import get_settings

    return get_settings().output_dir


# --- media -------------------------------------------------------------------------------------
# Inline media over ``RECAP_MEDIA_INLINE_BYTES`` is saved like a full tool output (its base64
# text under its content hash, so the same screenshot twice is one file) and the stored part
# says ``recap-media:<name>``. The name is all the row keeps: the file's path is always rebuilt
# under the output folder from a name that can only be 32 hex digits, never read from a row.


def media_path(root: Path, ref: str) -> Path | None:
    """Where the stored copy named ``ref`` lives under ``root`` (None for a malformed name)."""
    if media.REF_RE.match(media.REF_SCHEME + ref) is None:
        return None
    return Path(os.path.abspath(root)) / ref[:2] / f"{ref}{SUFFIX}"


def read_media(root: Path, ref: str) -> str | None:
    """The base64 text stored as ``ref``, or None when it is gone or does not match its name."""
    path = media_path(root, ref)
    if path is None or not path.is_file() or path.is_symlink():
        return None
    return read_output(str(path), root=root)


def media_loader(root: Path) -> media.Loader:
    """``read_media`` bound to an output folder: what the request view puts stored media back
    with."""
    return lambda ref: read_media(root, ref)


def export_parts(message: dict[str, Any], root: Path, *, full: bool) -> dict[str, Any]:
    """An exported message's media parts without Recap's key; with ``full``, a stored part's
    data field holds its bytes again (as the data URL, or the base64 audio) while its file
    exists, else it keeps its ``recap-media:`` reference."""
    content = message.get("content")
    if not isinstance(content, list) or not media.has_media(content):
        return message
    parts = []
    for part in content:
        ref = media.ref_of(part) if media.kind_of(part) else None
        encoded = read_media(root, ref) if full and ref is not None else None
        if encoded is not None:
            part = media.with_data(part, media.data_field(media.meta_of(part), encoded))
        parts.append(media.strip_meta(part))
    return {**message, "content": parts}


# --- ingest ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Ingest:
    """The ingest step: oversized tool outputs and call arguments become previews plus a file."""

    root: Path
    limits: Limits
    max_argument_chars: int
    media_inline_bytes: int = MEDIA_INLINE_BYTES  # RECAP_MEDIA_INLINE_BYTES
    journal: WriteJournal | None = None  # set per unit of work by ``journaled``

    @classmethod
    def from_settings(cls, settings: Settings) -> Ingest:
        return cls(
            root=settings.output_dir,
            limits=Limits(settings.max_output_lines, settings.max_output_bytes),
            max_argument_chars=settings.max_argument_chars,
            media_inline_bytes=settings.media_inline_bytes,
        )

    def journaled(self, journal: WriteJournal) -> Ingest:
        """The same step, recording the files it writes in ``journal``."""
        return replace(self, journal=journal)

    def __call__(self, message: dict[str, Any]) -> dict[str, Any]:
        """The message as it should be stored (a copy; the input is left as it is)."""
        return self.prepare(message).message

    def prepare(self, message: dict[str, Any]) -> Prepared:
        """The message as it should be stored and, apart from it, what ingest derived: the file
        a cut output was saved to and its size (the message never carries those)."""
        if media.has_media(message.get("content")):
            return Prepared(self._store_media(message))
        if message.get("role") == "tool" and isinstance(message.get("content"), str):
            return self._truncate_output(message)
        if message.get("role") == "assistant" and message.get("tool_calls"):
            return self._trim_calls(message)
        return Prepared(message)

    def _store_media(self, message: dict[str, Any]) -> dict[str, Any]:
        """Each media part with Recap's metadata; inline data over the limit saved to a file
        and replaced by its reference (kept inline when the file cannot be written)."""
        parts = []
        for index, part in enumerate(message["content"]):
            if not media.kind_of(part):
                parts.append(part)
                continue
            checked = media.check_part(part, f"message part {index}")
            meta = dict(checked.meta)
            value = media.data_of(part) or ""
            if checked.data is not None and len(value) > self.media_inline_bytes:
                encoded = "".join(value.split(",", 1)[-1].split())
                path = self._save(encoded, message)
                if path is not None:
                    meta["ref"] = Path(path).stem
                    part = media.with_data(part, media.REF_SCHEME + meta["ref"])
            parts.append({**media.strip_meta(part), media.META_KEY: meta})
        return {**message, "content": parts}

    def _save(self, text: str, message: Mapping[str, Any]) -> str | None:
        try:
            return str(save_output(self.root, text, self.journal))
        except OSError as exc:
            log.error(
                "tool_output_not_saved",
                output_dir=str(self.root),
                role=message.get("role"),
                tool_call_id=message.get("tool_call_id"),
                bytes=byte_size(text),
                error=str(exc),
                kept="the full message",
            )
            return None

    def _truncate_output(self, message: dict[str, Any]) -> Prepared:
        text: str = message["content"]
        if not is_oversized(text, self.limits):
            return Prepared(message)
        path = self._save(text, message)
        if path is None:
            return Prepared(message)
        out = {**message, "content": output_preview(text, path, self.limits)}
        return Prepared(out, path, byte_size(text))

    def _trim_calls(self, message: dict[str, Any]) -> Prepared:
        calls = message["tool_calls"]
        oversized = [
            call
            for call in calls
            if len(str((call.get("function") or {}).get("arguments", ""))) > self.max_argument_chars
        ]
        if not oversized:
            return Prepared(message)
        original = json.dumps(calls, ensure_ascii=False)
        path = self._save(original, message)
        if path is None:
            return Prepared(message)
        trimmed = []
        for call in calls:
            function = dict(call.get("function") or {})
            shorter = trim_arguments(
                str(function.get("arguments", "")), path, self.max_argument_chars
            )
            if shorter is not None:
                function["arguments"] = shorter
            trimmed.append({**call, "function": function})
        return Prepared({**message, "tool_calls": trimmed}, path, byte_size(original))


def restore(message: Msg, root: Path | None = None) -> dict[str, Any]:
    """A stored message in import format with what ingest cut put back, while its file exists.

    Only the file Recap saved it to is read (a regular file at the path Recap builds under
    ``root``, default ``RECAP_OUTPUT_DIR``, of the size it recorded); for anything else the
    stored preview is kept."""
    out = message.to_openai()
    saved = read_output(message.output_path, root=root, size=message.original_bytes)
    if saved is None:
        return out
    if message.role == "tool":
        out["content"] = saved
    elif message.role == "assistant":
        try:
            calls = json.loads(saved)
        except ValueError:
            return out
        if isinstance(calls, list):
            out["tool_calls"] = calls
    return out


# --- cleanup -----------------------------------------------------------------------------------


@dataclass
class CleanupResult:
    """What one cleanup deleted."""

    deleted: int = 0
    bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"deleted": self.deleted, "bytes": self.bytes}


def cleanup_outputs(
    root: Path, *, now: float, retention_days: float, on_delete: Callable[[str], None] | None = None
) -> CleanupResult:
    """Delete regular files under ``root`` last written before ``now - retention_days``.

    Walks with directory descriptors and never follows a link: a link inside the folder, and
    whatever it points to, is left alone. Files that disappear meanwhile (a concurrent cleanup)
    are skipped; a file being written has a fresh time and is not expired. ``now`` is a Unix time.
    """
    if retention_days < 0:
        raise InputError(f"--retention-days must not be negative, got {retention_days:g}")
    result = CleanupResult()
    if not os.path.isdir(root):
        return result
    expiry = now - retention_days * 86_400
    top = os.path.realpath(root)  # the configured folder itself may be a link; nothing below it
    for folder, _dirs, files, folder_fd in os.fwalk(top, follow_symlinks=False):
        for name in files:
            try:
                info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
                if not stat.S_ISREG(info.st_mode) or info.st_mtime >= expiry:
                    continue
                os.unlink(name, dir_fd=folder_fd)
            except FileNotFoundError:
                continue
            result.deleted += 1
            result.bytes += info.st_size
            if on_delete is not None:
                on_delete(os.path.join(folder, name))
    return result
