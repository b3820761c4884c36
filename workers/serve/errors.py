"""Errors in the OpenAI format: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
UPSTREAM = "upstream_error"
SERVER = "server_error"


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
        404, f"No conversation {conversation_id!r} for this key.", code="conversation_not_found"
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
