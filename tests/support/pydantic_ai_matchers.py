"""The few helpers Pydantic AI's own tests use from ``dirty-equals`` and ``inline-snapshot``,
for the tests adapted from its repository: each matcher equals any value of its kind
(``IsStr(regex=...)`` one that matches the pattern), and ``snapshot(value)`` equals what equals
the value, with one allowance for the installed version: a ``ModelResponse`` written without a
``model_id`` (a field newer than the tests' commit) matches one that has it."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any


class _Matcher:
    kind: type | tuple[type, ...] = object

    def __init__(self, *args: Any, regex: str | None = None, **kwargs: Any) -> None:
        self.regex = re.compile(regex) if regex is not None else None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, self.kind):
            return False
        return self.regex is None or bool(self.regex.fullmatch(str(other)))

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class IsDatetime(_Matcher):
    kind = datetime


class IsStr(_Matcher):
    kind = str


def IsInstance(kind: type) -> Any:  # the name dirty-equals gives it
    """A matcher equal to any instance of ``kind``."""
    matcher = _Matcher()
    matcher.kind = kind
    return matcher


def _as_written(actual: Any, expected: Any) -> Any:
    """``actual`` without the fields ``expected`` was written without (see the module)."""
    from dataclasses import replace

    from pydantic_ai.messages import ModelResponse

    if isinstance(actual, list) and isinstance(expected, list) and len(actual) == len(expected):
        return [_as_written(a, e) for a, e in zip(actual, expected, strict=True)]
    responses = isinstance(actual, ModelResponse) and isinstance(expected, ModelResponse)
    newer = getattr(actual, "model_id", None) and getattr(expected, "model_id", None) is None
    if responses and newer:
        return replace(actual, model_id=None)
    return actual


class _Snapshot:
    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return bool(_as_written(other, self.value) == self.value)

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return repr(self.value)


def snapshot(value: Any) -> Any:
    """The expected value as written (inline-snapshot's checking mode, without its rewriting)."""
    return _Snapshot(value)
