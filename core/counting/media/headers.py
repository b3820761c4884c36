"""Sizes and durations read from a file's first bytes (PNG, JPEG, GIF, WebP, WAV); the bytes are
never decoded beyond their header."""

from __future__ import annotations

import struct

from recap.core.counting.media.kinds import HEADER_SCAN_BYTES


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
