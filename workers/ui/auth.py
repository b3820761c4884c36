"""Console sessions: a key typed into the login form, then an HttpOnly cookie.

A key of ``RECAP_UI_KEYS`` opens an operator's session (every conversation, and the actions); a
client key of ``RECAP_SERVE_KEYS`` opens a session that sees the conversations that key created
and nothing else, and takes no action. Keys are checked in constant time
(``workers.serve.auth.KeyRing``) and never stored: a session is a random token kept in this
process (its digest is the lookup key), with its own CSRF token that every form posts back.
Sessions end on logout, after ``SESSION_SECONDS``, or when the process restarts.

Wrong keys are limited per client address (``LoginLimiter``): after ``RECAP_UI_LOGIN_ATTEMPTS``
wrong keys within ``LOGIN_WINDOW_SECONDS`` the address is refused (429) until the oldest of them
leaves the window, before any key is looked at.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import SecretStr

from recap.workers.serve.auth import KeyRing
from recap.workers.ui.views import Scope

COOKIE = "recap_console"
SESSION_SECONDS = 12 * 3600  # a working day; then the key is asked for again
MAX_SESSIONS = 1_000  # sessions kept at once; the oldest goes first
TOKEN_BYTES = 32  # 256 bits of randomness per session and per CSRF token
LOGIN_WINDOW_SECONDS = 300  # wrong keys are counted over the last five minutes
MAX_ADDRESSES = 10_000  # addresses whose wrong keys are remembered; the oldest goes first


@dataclass(frozen=True)
class Session:
    scope: Scope
    csrf: str
    expires: float

    def csrf_matches(self, token: str | None) -> bool:
        """The form's token is this session's (compared as bytes: any text, in constant time)."""
        given = (token or "").encode("utf-8", "surrogatepass")
        return bool(given) and hmac.compare_digest(self.csrf.encode("ascii"), given)


class Sessions:
    """The open sessions of one console process."""

    def __init__(
        self,
        ui_keys: tuple[SecretStr, ...],
        serve_keys: tuple[SecretStr, ...],
        *,
        lifetime: float = SESSION_SECONDS,
    ) -> None:
        self._operators = KeyRing(ui_keys)
        self._clients = KeyRing(serve_keys)
        self._lifetime = lifetime
        self._open: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _digest(token: str) -> str:
        return hashlib.sha256(token.encode("utf-8")).hexdigest()

    def scope_of(self, key: str) -> Scope | None:
        """Whose view a key opens, or None for a wrong key. Both rings are checked whatever
        matches, so the time taken does not tell a UI key from a client key."""
        header = f"Bearer {key.strip()}"
        operator = self._operators.owner(header)
        client = self._clients.owner(header)
        if operator is not None:
            return Scope(operator=True)
        if client is not None:
            return Scope(operator=False, owner=client)
        return None

    def open(self, scope: Scope) -> tuple[str, Session]:
        """A new session for ``scope``: its cookie token and the session."""
        token = secrets.token_urlsafe(TOKEN_BYTES)
        session = Session(scope, secrets.token_urlsafe(TOKEN_BYTES), time.time() + self._lifetime)
        with self._lock:
            self._open[self._digest(token)] = session
            while len(self._open) > MAX_SESSIONS:
                self._open.popitem(last=False)
        return token, session

    def get(self, token: str | None) -> Session | None:
        if not token:
            return None
        digest = self._digest(token)
        with self._lock:
            session = self._open.get(digest)
            if session is not None and session.expires < time.time():
                del self._open[digest]
                return None
            return session

    def close(self, token: str | None) -> None:
        if token:
            with self._lock:
                self._open.pop(self._digest(token), None)


class LoginLimiter:
    """Wrong keys per client address over a sliding window, in this process: ``wait`` says
    how long an address must wait before its next try (0: it may try now)."""

    def __init__(
        self,
        attempts: int,
        *,
        window: float = LOGIN_WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._attempts = attempts
        self._window = window
        self._clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def wait(self, address: str) -> int:
        """Whole seconds until ``address`` may try a key again; 0 when it may now."""
        now = self._clock()
        with self._lock:
            failures = self._recent(address, now)
            if failures is None or len(failures) < self._attempts:
                return 0
            return max(math.ceil(failures[0] + self._window - now), 1)

    def failed(self, address: str) -> None:
        """One more wrong key from ``address``."""
        now = self._clock()
        with self._lock:
            failures = self._recent(address, now)
            if failures is None:
                failures = self._failures[address] = deque(maxlen=self._attempts)
            failures.append(now)
            self._failures.move_to_end(address)
            while len(self._failures) > MAX_ADDRESSES:
                self._failures.popitem(last=False)

    def succeeded(self, address: str) -> None:
        """A right key from ``address``: its wrong keys are forgotten."""
        with self._lock:
            self._failures.pop(address, None)

    def _recent(self, address: str, now: float) -> deque[float] | None:
        """The address's wrong keys still in the window (those older are dropped)."""
        failures = self._failures.get(address)
        if failures is None:
            return None
        while failures and failures[0] <= now - self._window:
            failures.popleft()
        if not failures:
            del self._failures[address]
            return None
        return failures
