"""The request profile's values (pure): what ``assemble`` records of the request it built and
what ``record_usage`` records of the provider's reading, as plain values; their storage is
``core.storage.profile``."""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

HASH_BYTES = 16  # 128 bits: a collision between two versions of one host's parts is not a risk


@dataclass(frozen=True, slots=True, kw_only=True)
class Reading:
    """The latest provider reading of a conversation: Recap's count of the request it measured
    (the one last assembled for that leaf) and the prompt tokens reported for it."""

    estimated: int
    measured: int
    leaf_id: int | None
    at: datetime | None
    state: str | None = None  # the key of the request measured (``core.storage.profile.state_key``)
    # The rates per kind of content fitted over the recent readings, the residual quantile, the
    # reach per kind and the rate past it (``core.counting.calibration.KindFactors.values``);
    # None before a reading of known composition.
    kinds: tuple[float, ...] | None = None


@dataclass(frozen=True, slots=True)
class FixedParts:
    """Token counts of what one ``assemble`` call was given beside the history."""

    system: int = 0
    tools: int = 0
    reminder: int = 0
    context: int = 0

    @property
    def total(self) -> int:
        return self.system + self.tools + self.reminder + self.context


@dataclass(frozen=True, slots=True)
class Sent:
    """The request ``assemble`` last built: Recap's count of it, its leaf and its state key."""

    tokens: int
    leaf_id: int | None
    state: str | None
    # Its estimate split by kind of content (``core.counting.kinds``), rounded to 0.1 token.
    composition: tuple[float, ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """One conversation's stored profile as plain values."""

    parts: FixedParts | None  # None until the first assemble
    content_hash: str | None
    reserve_override: int | None
    reading: Reading | None
    sent: Sent | None = None
    assembled_at: datetime | None = None  # the last request assembled (its cache's last use)
    spec_hash: str | None = None  # the hash of what the last request was given, as stored text


def state_key(
    *,
    model: str,
    leaf_id: int | None,
    summary_id: int | None,
    clearings: Collection[int],
    content_hash: str | None,
    pins: Collection[int] = (),
    steps: int | None = None,
) -> str:
    """A key of what a request is built from: another model, leaf, summary, a new clearing,
    another set of pinned messages or other fixed parts give another key, so a reading of one
    request is not taken for another.

    Clearings are one-way, so their number and newest message id change with every new
    message recorded; ``steps`` (``core.values.records.steps_of``) grows with every further step
    of a message already recorded (an aged result cleared, old arguments shortened). A state of
    cleared messages alone keeps the key it had before the aged stage existed. Pins come and go,
    so they are named one by one (a branch without pins keys as before pins existed)."""
    newest = max(clearings) if clearings else 0
    text = f"{model}|{leaf_id}|{summary_id}|{len(clearings)}|{newest}|{content_hash or ''}"
    if steps is not None and steps != 2 * len(clearings):
        text += f"|{steps}"
    if pins:
        text += "|pins:" + ",".join(str(mid) for mid in sorted(pins))
    return hashlib.blake2b(
        text.encode("utf-8", "surrogatepass"), digest_size=HASH_BYTES
    ).hexdigest()


def fingerprint(
    system: str | None, tools_text: str, reminder: str | None, files: tuple[Any, ...]
) -> str:
    """A hash of the fixed parts' text (the tools as canonical JSON), to tell a change."""
    digest = hashlib.blake2b(digest_size=HASH_BYTES)
    for part in (system or "", tools_text, reminder or ""):
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part.encode("utf-8", "surrogatepass"))
    for file in files:
        for part in (file.name, file.text):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()
