"""Files and folders Recap creates are its user's alone: folders 0700, files 0600.

The SQLite database (its ``-wal`` and ``-shm`` files take the database file's mode), ``.recap/``,
the embedded broker's folders and messages, and the saved tool outputs. Only what Recap creates
is given these modes: a folder or file that was there before keeps its own.
"""

from __future__ import annotations

import os
from pathlib import Path

FOLDER_MODE = 0o700
FILE_MODE = 0o600


def make_folder(folder: Path | str) -> None:
    """Create ``folder`` and every missing folder above it, each 0700 (``mkdir -p`` gives the
    parents the umask's mode instead); folders already there are left as they are."""
    missing: list[str] = []
    current = os.path.abspath(folder)
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for path in reversed(missing):
        try:
            os.mkdir(path, FOLDER_MODE)
        except FileExistsError:
            if not os.path.isdir(path):
                raise
            continue  # another process made it meanwhile: its mode is its own
        os.chmod(path, FOLDER_MODE)  # exactly 0700, whatever the umask took away


def create_file(path: Path | str) -> bool:
    """Create ``path`` empty and 0600 unless something is there already; whether it was made."""
    try:
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        return False
    try:
        os.fchmod(handle, FILE_MODE)
    finally:
        os.close(handle)
    return True


def private_opener(path: str, flags: int) -> int:
    """An ``opener`` for ``open()``: a file it creates is 0600 (an existing one keeps its mode)."""
    return os.open(path, flags, FILE_MODE)
