"""Client keys: ``Authorization: Bearer KEY`` against ``RECAP_SERVE_KEYS``, in constant time.

A key is never stored or logged: conversations record its fingerprint, a SHA-256 digest that
tells keys apart and cannot be turned back into one.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from pydantic import SecretStr

FINGERPRINT_CHARS = 32  # 128 bits: two keys never share a fingerprint
FINGERPRINT_SALT = b"recap-serve-key:"  # a fingerprint is no plain hash of the key


def fingerprint(key: str) -> str:
    """The stored stand-in of a client key."""
    return hashlib.sha256(FINGERPRINT_SALT + key.encode("utf-8")).hexdigest()[:FINGERPRINT_CHARS]


class KeyRing:
    """The configured client keys, checked without revealing through timing which one matched
    or how much of a wrong key was right."""

    def __init__(self, keys: Iterable[SecretStr]) -> None:
        self._digests = [self._digest(key.get_secret_value()) for key in keys]

    @staticmethod
    def _digest(key: str) -> bytes:
        return hashlib.sha256(key.encode("utf-8")).digest()

    def __bool__(self) -> bool:
        return bool(self._digests)

    def owner(self, authorization: str | None) -> str | None:
        """The fingerprint of the bearer key when it is a configured one, else None."""
        scheme, _, key = (authorization or "").partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            return None
        candidate = self._digest(key)
        matched = False
        for digest in self._digests:  # every key is compared, whichever matches
            matched |= hmac.compare_digest(candidate, digest)
        return fingerprint(key) if matched else None
