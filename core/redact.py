"""One redaction step: every error, log line, event, stored reason and task result that could
carry a secret goes through ``redact`` (or ``error_text``) before it leaves the process.

Masked: each known secret wherever it appears (the settings' keys and URL passwords, see
``known_secrets``), the password of any ``scheme://user:PASSWORD@host`` URL, and key-shaped
strings: ``sk-...``/``sk-ant-...`` keys, ``Bearer`` tokens, ``Authorization: Basic ...``
headers, ``api_key=...`` and ``"password": "..."`` style assignments, and long tokens right
after the words key, token or secret (``Incorrect API key provided: ...``). A masked value keeps
enough to tell keys apart (``sk-...abcd``) or becomes ``***``. Every pattern is linear: each is
anchored at a word start by a lookbehind and its repetitions are bounded, so no input makes a
regex backtrack badly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import quote, unquote

from pydantic import BaseModel, SecretStr

MASK = "***"
MIN_SECRET_CHARS = 4  # a shorter known secret would mask ordinary words; URLs still mask it
HINT_MIN_CHARS = 20  # a key this long keeps its last characters visible, as providers show them
HINT_CHARS = 4  # last characters kept: enough to tell two keys apart, far too few to use one
TOKEN_MIN_CHARS = 16  # shorter values after "key"/"token" are ids and names, not credentials
MAX_ERROR_CHARS = 1_000  # a provider can answer with a whole page; one line stays readable

SK_KEY = re.compile(r"(?<![A-Za-z0-9_-])sk-(?:ant-)?[A-Za-z0-9_-]{16,}")
URL_PASSWORD = re.compile(
    r"(?i)(?<![a-z0-9+.-])(?P<scheme>[a-z][a-z0-9+.-]{0,30}://)"
    r"(?P<user>[^:/@\s]{0,256}):(?P<pw>[^@/\s]{1,512})@"
)
BEARER = re.compile(r"(?i)(?<![A-Za-z0-9])(?P<scheme>Bearer)\s{1,5}[A-Za-z0-9._~+/=-]{6,}")
AUTH_HEADER = re.compile(  # Basic and Digest credentials are masked only in the header itself
    r"(?i)(?<![A-Za-z0-9_-])(?P<head>authorization[\"']?\s{0,3}[:=]\s{0,3}[\"']?"
    r"(?:Basic|Digest)\s{1,5})[^\s\"',;]{1,2048}"
)
ASSIGNMENT = re.compile(
    r"(?i)(?<![A-Za-z0-9_-])(?P<name>[A-Za-z0-9_-]{0,40}?"
    r"(?:keys?|token|secret|password|passwd|pwd|authorization|credentials?))"
    r"(?P<sep>[\"']?\s{0,3}[:=]\s{0,3}[\"']?)(?P<value>[^\s\"',;&}\]]{1,1024})"
)
NEAR_WORD = re.compile(
    r"(?i)(?<![A-Za-z0-9])(?:key|token|secret)(?![A-Za-z0-9])"
    r"(?P<gap>(?:[^A-Za-z0-9\n]{1,3}[A-Za-z]{1,12}){0,2}[^A-Za-z0-9\n]{1,3})"
    r"(?P<value>[A-Za-z0-9+/=_.-]{16,1024})"
)
# Names whose value is always a credential, whatever it looks like.
STRONG_NAME = re.compile(
    r"(?i)(api[_-]?keys?|token|secret|password|passwd|pwd|authorization|credentials?)$"
)
TOKEN_SHAPE = re.compile(r"(?=[^\d]*\d)(?=[^A-Za-z]*[A-Za-z])[A-Za-z0-9+/=_.-]+")
SECRET_FIELD = re.compile(r"(?i)(_keys?$|password|secret)")


def mask_value(value: str) -> str:
    """The masked form of one secret: ``sk-...abcd`` for a long provider key, else ``***``."""
    if len(value) < HINT_MIN_CHARS:
        return MASK
    prefix = "sk-ant-" if value.startswith("sk-ant-") else "sk-" if value.startswith("sk-") else ""
    return f"{prefix}...{value[-HINT_CHARS:]}" if prefix else MASK


def _already_masked(value: str) -> bool:
    return MASK in value or "..." in value


def _looks_like_token(value: str) -> bool:
    return len(value) >= TOKEN_MIN_CHARS and TOKEN_SHAPE.fullmatch(value) is not None


def _assignment(match: re.Match[str]) -> str:
    value = match["value"]
    if _already_masked(value) or value.lower() in ("bearer", "basic", "digest"):
        return match[0]
    if STRONG_NAME.search(match["name"]) or _looks_like_token(value):
        return f"{match['name']}{match['sep']}{MASK}"
    return match[0]


def _near_word(match: re.Match[str]) -> str:
    value = match["value"]
    if _already_masked(value) or not _looks_like_token(value):
        return match[0]
    return match[0][: match.start("value") - match.start()] + MASK


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every known secret and every key-shaped string masked (idempotent)."""
    for secret in sorted({s for s in secrets if s and len(s) >= MIN_SECRET_CHARS}, key=len)[::-1]:
        if secret in text:
            text = text.replace(secret, mask_value(secret))
    text = URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    text = SK_KEY.sub(lambda m: mask_value(m[0]), text)
    text = BEARER.sub(lambda m: f"{m['scheme']} {MASK}", text)
    text = AUTH_HEADER.sub(lambda m: f"{m['head']}{MASK}", text)
    text = ASSIGNMENT.sub(_assignment, text)
    return NEAR_WORD.sub(_near_word, text)


def _url_passwords(text: str) -> list[str]:
    found = []
    for match in URL_PASSWORD.finditer(text):
        raw = match["pw"]
        found += [raw, unquote(raw)]
    return found


def _values(value: object) -> list[str]:
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, list | tuple | set | frozenset):
        return [text for item in value for text in _values(item)]
    return []


def known_secrets(settings: BaseModel) -> list[str]:
    """Every secret a settings object holds: secret-typed values, ``*_key``/``*_keys``/
    ``*password*``/``*secret*`` fields, and the password of every URL in any field."""
    found: list[str] = []
    for name in type(settings).model_fields:
        value = getattr(settings, name, None)
        if isinstance(value, SecretStr) or SECRET_FIELD.search(name):
            found += _values(value)
        if isinstance(value, str):
            found += _url_passwords(value)
    found += [quote(secret, safe="") for secret in found]  # as it appears inside a URL
    return sorted({s for s in found if len(s) >= MIN_SECRET_CHARS})


def one_line(text: str) -> str:
    """Whitespace runs (newlines included) collapsed to single spaces."""
    return " ".join(text.split())


def error_text(exc: BaseException, secrets: Iterable[str | None] = ()) -> str:
    """One line for an error: its class and masked message, no traceback, at most
    ``MAX_ERROR_CHARS`` (masked before it is cut, so no half secret survives the cut)."""
    message = one_line(redact(str(exc), secrets))
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


# --- text Recap relays and stores: the completion text of a reply ------------------------------
#
# A reply's text is the model's own words, where key-shaped strings (``api_key = os.environ[...]``
# in a code answer) are content, not leaks: only what is known to be secret is masked there (the
# configured keys and URL passwords, see ``known_secrets``) and the password of any URL.

# A URL's credentials, whatever its scheme: "://user:PASSWORD@". In a reply the scheme may
# have left in an earlier piece of a stream; what is masked is the same either way.
URL_CREDENTIALS = re.compile(r"://(?P<user>[^:/@\s]{0,256}):(?P<pw>[^@/\s]{1,512})@")
# The end of a text that may be the start of a URL's credentials: a colon and up to two
# slashes, or an authority not ended yet. Held back from a stream until the next piece tells.
URL_TAIL = re.compile(r"(?::/{0,2}|://[^\s/@]{0,768})\Z")
URL_TAIL_WINDOW = 1_024  # characters at the end of a piece where an open URL is looked for


def mask_known(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every known secret and every URL password masked, nothing else changed
    (``secrets`` as ``known_secrets`` gives them)."""
    for secret in sorted({s for s in secrets if len(s) >= MIN_SECRET_CHARS}, key=len)[::-1]:
        if secret in text:
            text = text.replace(secret, mask_value(secret))
    if "://" in text:
        text = URL_CREDENTIALS.sub(lambda m: f"://{m['user']}:{MASK}@", text)
    return text


def mask_strings(value: object, secrets: Iterable[str] = ()) -> tuple[object, bool]:
    """A JSON value with ``mask_known`` applied to every string in it, and whether any
    changed (the value itself, unchanged, when none did)."""
    keep = list(secrets)
    if isinstance(value, str):
        masked = mask_known(value, keep)
        return masked, masked != value
    if isinstance(value, list):
        items = [mask_strings(item, keep) for item in value]
        if any(changed for _, changed in items):
            return [item for item, _ in items], True
        return value, False
    if isinstance(value, dict):
        pairs = {key: mask_strings(item, keep) for key, item in value.items()}
        if any(changed for _, changed in pairs.values()):
            return {key: item for key, (item, _) in pairs.items()}, True
        return value, False
    return value, False


def mask_in_place(value: object, secrets: Sequence[str]) -> bool:
    """``mask_known`` applied to every string of a JSON object or list, in place; whether any
    changed. ``secrets`` as ``StreamMasker.secrets`` holds them (at least ``MIN_SECRET_CHARS``
    long, longest first): a string holding none of them and no ``://`` is left as it is without
    running the masks (a streamed chunk's strings are short and almost never hold one)."""
    changed = False
    if isinstance(value, dict):
        pairs: Iterable[tuple[Any, object]] = list(value.items())
    elif isinstance(value, list):
        pairs = list(enumerate(value))
    else:
        return False
    for key, item in pairs:
        if isinstance(item, str):
            if "://" in item or any(secret in item for secret in secrets):
                masked = mask_known(item, secrets)
                if masked != item:
                    value[key] = masked
                    changed = True
        elif isinstance(item, dict | list):
            changed |= mask_in_place(item, secrets)
    return changed


class StreamMasker:
    """``mask_known`` over texts that arrive in pieces (a streamed reply's content, reasoning
    and tool-call arguments, each under its own key): a piece's end that could begin a secret
    or a URL with a password is held back until the next piece (or ``flush``) shows whether it
    does, so no secret gets through split across two pieces."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = sorted({s for s in secrets if len(s) >= MIN_SECRET_CHARS}, key=len)[::-1]
        self._pending: dict[object, str] = {}

    def feed(self, key: object, piece: str) -> str:
        """The part of the text so far under ``key`` that can be released, masked."""
        text = mask_known(self._pending.pop(key, "") + piece, self.secrets)
        held = self._held(text)
        if held:
            self._pending[key] = text[-held:]
            return text[:-held]
        return text

    def flush(self, key: object) -> str:
        """Whatever is still held under ``key``, masked: the text has ended."""
        return mask_known(self._pending.pop(key, ""), self.secrets)

    def holding(self, key: object) -> bool:
        return key in self._pending

    def _held(self, text: str) -> int:
        """How many characters at the end of ``text`` may begin a secret or a URL password."""
        held = 0
        for secret in self.secrets:
            start = text.find(secret[0], max(0, len(text) - len(secret) + 1))
            while start != -1 and len(text) - start > held:
                if secret.startswith(text[start:]):
                    held = len(text) - start
                    break
                start = text.find(secret[0], start + 1)
        window = text[-URL_TAIL_WINDOW:]
        tail = URL_TAIL.search(window) if ":" in window else None
        if tail is not None:
            held = max(held, len(tail[0]))
        return held
