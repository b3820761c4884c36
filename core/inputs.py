"""Files a command is given, read whole but never past ``RECAP_MAX_INPUT_BYTES``.

An import file, ``--content-file``, ``--tools`` and ``--context-file`` are read into memory; a
device or a file that never ends (``/dev/zero``) or one larger than the limit is one
``InputError`` naming the setting, after reading at most one byte past the limit.
"""

from __future__ import annotations

from pathlib import Path

from recap.core.errors import InputError

LIMIT_SETTING = "RECAP_MAX_INPUT_BYTES"
READ_CHUNK = 1 << 20  # bytes per read: a large file is never asked for in one allocation


def read_bytes(path: Path, limit: int) -> bytes:
    """The file's bytes, or an ``InputError``: unreadable, or more than ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    try:
        with path.open("rb") as stream:
            while size <= limit:
                chunk = stream.read(min(READ_CHUNK, limit + 1 - size))
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
                size += len(chunk)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    raise InputError(
        f"{path} is larger than {LIMIT_SETTING} ({limit:,} bytes); split it, or raise the setting"
    )


def read_text(path: Path, limit: int) -> str:
    """The file as UTF-8 text, within ``limit`` bytes (see ``read_bytes``)."""
    data = read_bytes(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"cannot read {path}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
