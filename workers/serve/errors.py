"""Errors in the OpenAI format: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import re
from typing import Any

from starlette.responses import JSONResponse

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
UPSTREAM = "upstream_error"
SERVER = "server_error"
BAD_GATEWAY = 502
MAX_CLIENT_TEXT = 500  # characters of an upstream's message a client is shown
MAX_ECHO_CHARS = 80  # characters of a client's own value (an id, a reference) an error repeats
# What a client must never see of the server: a traceback, and file system paths (a path
# starts a word and is not part of a URL: its first "/" follows no ":", "/" or name character).
TRACEBACK = re.compile(r"(?s)\s*Traceback \(most recent call last\).*")
FILE_LINE = re.compile(r'File "[^"\n]{0,512}", line \d+(?:, in \S+)?')
SERVER_PATH = re.compile(
    r"(?<![\w:/.~-])(?:~|[A-Za-z]:)?[/\\](?:[\w.@+-]{1,128}[/\\]){1,64}[\w.@+-]*"
)


class ServeError(Exception):
    """An error the client gets as an OpenAI-format body with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param

    def body(self) -> dict[str, Any]:
        """The error object as OpenAI sends it."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def client_text(text: str) -> str:
    """An error message as a client may read it: one line, no traceback, no server path, at
    most ``MAX_CLIENT_TEXT`` characters (secrets are masked before, by the caller)."""
    text = TRACEBACK.sub("", text)
    text = FILE_LINE.sub("(server file)", text)
    text = SERVER_PATH.sub("(server path)", text)
    text = " ".join(text.split())
    return text if len(text) <= MAX_CLIENT_TEXT else text[: MAX_CLIENT_TEXT - 1] + "…"


def echoed(value: str, limit: int = MAX_ECHO_CHARS) -> str:
    """A value the client sent, as an error repeats it: quoted, and cut to ``limit``
    characters with the length it had (a 5,000-character id is not sent back whole)."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}… ({len(value)} characters)"


def bad_gateway(message: str) -> ServeError:
    """The upstream answered with something that is no reply."""
    return ServeError(BAD_GATEWAY, f"upstream model error: {message}", type=UPSTREAM)


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> ServeError:
    return ServeError(400, message, param=param, code=code)


def unauthorized() -> ServeError:
    return ServeError(
        401,
        "Incorrect or missing API key: send `Authorization: Bearer KEY` with a key from "
        "RECAP_SERVE_KEYS.",
        type=AUTHENTICATION,
        code="invalid_api_key",
    )


def not_found(conversation_id: str) -> ServeError:
    return ServeError(
        404,
        f"No conversation {echoed(conversation_id)} for this key.",
        code="conversation_not_found",
    )


def too_large(limit: int) -> ServeError:
    return ServeError(
        413,
        f"The request body is larger than {limit} bytes (RECAP_SERVE_MAX_BODY_BYTES).",
        code="request_too_large",
    )


def context_too_long(detail: str) -> ServeError:
    return ServeError(
        400,
        "The conversation does not fit the model's context window even after compression: "
        + detail,
        code="context_length_exceeded",
    )
