"""The console's fields: one rule per field, used by every page and action that takes it.

A field either reads as what it names or the request is refused with one line naming the field
(400); nothing is replaced by a default behind the user's back, and an empty field means its
default. Ids are checked against the database after this (``workers.ui.routes``): a
conversation that does not exist, or a message of another conversation, is a 404.

Numbers are ASCII digits only: ``str.isdigit`` and ``int`` also take ``²``, Arabic-Indic and
fullwidth digits, ``1_0`` and surrounding spaces, which no link the console writes contains.
"""

from __future__ import annotations

import re

from recap.core.values.console import SORTS
from recap.core.values.limits import MESSAGE_ID_MAX, NAME_MAX_CHARS

PAGE_SIZE = 25  # conversations per page by default
PAGE_SIZE_MAX = 200  # a page is two statements over its ids: bounded so it stays cheap
PAGE_MAX = 10**9  # far past any last page (a page past the last one is empty)
SEARCH_CHARS_MAX = NAME_MAX_CHARS  # the search matches ids, which are at most this long
SHOWN_CHARS = 40  # of a refused value, in the message
_DIGITS = re.compile(r"[0-9]{1,40}")
_TASK_ID = re.compile(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}")  # a Celery task id
SORT_DEFAULT = "activity"
DIRECTIONS = ("desc", "asc")


class FieldError(ValueError):
    """A field that does not read as what it names: a 400 (or a 404 for an id that cannot
    exist), with one line for the page."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def shown(value: str) -> str:
    """A refused value as the message quotes it: cut, and with its control characters
    escaped."""
    cut = value[:SHOWN_CHARS] + ("…" if len(value) > SHOWN_CHARS else "")
    return repr(cut)


def whole_number(text: str, name: str, *, low: int, high: int) -> int:
    """ASCII digits for a number in ``low..high``, else a ``FieldError`` naming ``name``."""
    if _DIGITS.fullmatch(text) is None or not low <= int(text) <= high:
        raise FieldError(f"{name} must be a whole number from {low} to {high}, not {shown(text)}")
    return int(text)


def leaf(text: str | None) -> int | None:
    """``leaf`` (the page's ``?leaf=``, compress now's form): a message id, or empty for the
    branch's latest message. That it is a message of the conversation is checked after."""
    if not text:
        return None
    return whole_number(text, "leaf", low=1, high=MESSAGE_ID_MAX)


def conversation(text: str | None) -> str:
    """``conversation`` (the actions' form, the page's address): an id that can exist (a 404
    otherwise, as for one that does not)."""
    value = text or ""
    if not value or len(value) > NAME_MAX_CHARS or "\x00" in value or not _encodable(value):
        raise FieldError(f"unknown conversation {shown(value)}", status=404)
    return value


def page(text: str | None) -> int:
    """``page`` of the list: from 1 (the default)."""
    return whole_number(text, "page", low=1, high=PAGE_MAX) if text else 1


def size(text: str | None) -> int:
    """``size`` of a list page: 1 to ``PAGE_SIZE_MAX`` (default ``PAGE_SIZE``)."""
    return whole_number(text, "size", low=1, high=PAGE_SIZE_MAX) if text else PAGE_SIZE


def sort(text: str | None) -> str:
    """``sort`` of the list: one of ``core.values.console.SORTS``."""
    if not text:
        return SORT_DEFAULT
    if text not in SORTS:
        raise FieldError(f"sort must be one of {', '.join(SORTS)}, not {shown(text)}")
    return text


def descending(text: str | None) -> bool:
    """``dir`` of the list: ``desc`` (the default) or ``asc``."""
    if not text:
        return True
    if text not in DIRECTIONS:
        raise FieldError(f"dir must be desc or asc, not {shown(text)}")
    return text == "desc"


def search(text: str | None) -> str:
    """``q`` of the list: text an id could contain (at most an id's length, no NUL)."""
    value = (text or "").strip()
    if len(value) > SEARCH_CHARS_MAX or "\x00" in value or not _encodable(value):
        raise FieldError(
            f"q must be at most {SEARCH_CHARS_MAX} characters of text, not {shown(value)}"
        )
    return value


def task_id(text: str | None) -> str | None:
    """``enqueued`` (the notice after an action): the task id the action sent (a UUID)."""
    if not text:
        return None
    if _TASK_ID.fullmatch(text) is None:
        raise FieldError(f"enqueued must be a task id, not {shown(text)}")
    return text


def _encodable(text: str) -> bool:
    """Text the database can store (no lone surrogate from a bad escape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
