"""What a provider's context-length error says about the refused request: its size in the
provider's tokens ("your messages resulted in N tokens", "prompt is too long: N tokens > M
maximum") and the window it was refused against. Shared by the framework adapters'
``recap.integrations._loop`` and `recap serve`, which both record the stated size as a usage
reading of the refused request (the calibration learns from it) before trying again.
"""

from __future__ import annotations

import re

# The request's size as the error states it: OpenAI's "your messages resulted in N tokens",
# Anthropic's "prompt is too long: N tokens > M maximum".
STATED_COUNT = re.compile(r"resulted in ([\d,]+) tokens|too long: ([\d,]+) tokens")
# The window it was refused against: OpenAI's and the servers that copy it ("maximum context
# length is M tokens"), Anthropic's ("N tokens > M maximum"), llama.cpp's ("context size of M"),
# others' ("context window of M", "n_ctx: M", "while limit is M", "maximum input length is M").
STATED_LIMIT = (
    re.compile(r"maximum context length is ([\d,]+)"),
    re.compile(r"tokens? > ([\d,]+) maximum"),
    re.compile(r"context (?:length|window|size) of ([\d,]+)"),
    re.compile(r"n_ctx\W+([\d,]+)"),
    re.compile(r"while limit is ([\d,]+)"),
    re.compile(r"maximum input length is ([\d,]+)"),
)
MAX_CAUSES = 8  # how far down an error's causes an overflow is looked for


def chain(exc: BaseException) -> list[BaseException]:
    """The error and its causes (``raise ... from``, or the context it was raised in)."""
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in out and len(out) < MAX_CAUSES:
        out.append(current)
        current = current.__cause__ or current.__context__
    return out


def _stated(exc: BaseException, *patterns: re.Pattern[str]) -> int | None:
    for error in chain(exc):
        for pattern in patterns:
            found = pattern.search(str(error))
            if found:
                return int(next(g for g in found.groups() if g).replace(",", ""))
    return None


def stated_tokens(exc: BaseException) -> int | None:
    """The request's size in the provider's tokens, when its error says it."""
    return _stated(exc, STATED_COUNT)


def stated_limit(exc: BaseException) -> int | None:
    """The window the provider refused the request against, when its error says it."""
    return _stated(exc, *STATED_LIMIT)
