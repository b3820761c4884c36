"""Errors that carry one clear line for the user; the CLI prints them without a traceback."""

from __future__ import annotations


class RecapError(Exception):
    """Base of every error Recap reports to a user as one line."""


class InputError(RecapError, ValueError):
    """The input is malformed or inconsistent; nothing was written."""


class NotFoundError(RecapError, LookupError):
    """An unknown conversation or message."""


class ConversationGone(NotFoundError):
    """The conversation was deleted while a run was working on it: the run writes nothing."""


class PinLimitError(InputError):
    """Pinning the message would put the conversation's pinned tokens over
    ``RECAP_MAX_PINNED_TOKENS``; nothing was pinned."""


class BudgetError(RecapError, ValueError):
    """The part of a request that must be sent does not fit the window."""


class SchemaMissingError(RecapError):
    """The database has no Recap schema (or no database file) yet: ``recap init`` creates it."""


class DatabaseUrlError(RecapError, ValueError):
    """``RECAP_DATABASE_URL`` names no database Recap can open or create."""
