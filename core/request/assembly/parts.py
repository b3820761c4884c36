"""The parts of a request built now rather than stored (system prompt, summary message, tools,
reminder, context files), counted once per text (cached), and what the stages share about the
branch: its stored system prompt and the messages after the summary's cutoff."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from recap.core.counting import reasoning, tokens
from recap.core.errors import InputError
from recap.core.request import refs
from recap.core.request.native_items import SUMMARY_ITEMS_KEY, stored_items
from recap.core.summaries.prompts import SUMMARY_MESSAGE_PREFIX
from recap.core.values.records import SYSTEM_ROLES, Msg, SummaryRec
from recap.core.values.request import ContextFile, RequestSpec

# The summary, context files, forgotten-file note and reminder are user messages: every provider
# accepts a user message anywhere, while a system message after the first is rejected by several
# chat templates and folded into the system prompt by others (which would move it out of order).
ADDED_ROLE = "user"
# A clearing of this reason records that an older assistant message's thinking is no longer sent
# (its turn ended), with the tokens that saves: decisions that read no content plan without it.
REASONING_CLEARING = "reasoning"
GAP_NOTE = "[Earlier messages of this conversation are left out here to fit the context window.]"
COUNT_CACHE_SIZE = 512  # distinct system prompts, summaries, reminders and files kept counted


@lru_cache(maxsize=COUNT_CACHE_SIZE)
def count(role: str, text: str, encoding: str) -> int:
    """Tokens of one message of ``role`` saying ``text`` (cached by text)."""
    return tokens.count_message({"role": role, "content": text}, encoding)


@lru_cache(maxsize=COUNT_CACHE_SIZE)
def _count_tools(schema_text: str, encoding: str) -> int:
    return tokens.count_tools(json.loads(schema_text), encoding)


def tools_tokens(tools: Sequence[Mapping[str, Any]] | None, encoding: str) -> int:
    """Tokens of the tool schemas (cached by their JSON)."""
    if not tools:
        return 0
    schema_text = json.dumps(list(tools), sort_keys=True, separators=(",", ":"))
    return _count_tools(schema_text, encoding)


def stored_prompt(branch: Sequence[Msg]) -> Msg | None:
    """The branch's stored system prompt: its root message, when that is a system message."""
    if branch and branch[0].parent_id is None and branch[0].role in SYSTEM_ROLES:
        return branch[0]
    return None


def system_part(
    root: Msg | None, system: str | None, encoding: str
) -> tuple[dict[str, Any] | None, int]:
    """The system message and its tokens: the given prompt, else the stored one."""
    if system:
        return {"role": "system", "content": system}, count("system", system, encoding)
    if root is not None:
        return root.to_openai(), root.tokens
    return None, 0


def summary_part(
    summary: SummaryRec | None, encoding: str, model: str | None = None, *, text_only: bool = False
) -> tuple[dict[str, Any] | None, int]:
    """The summary message and its tokens (none without a summary). Where the provider of
    ``model`` compacted the same span (``core.compression.provider``), the message carries its
    items (``SUMMARY_ITEMS_KEY``: a native dialect sends them in place of the text) and counts
    the larger of the two; for any other model it says how many it leaves out."""
    if summary is None:
        return None, 0
    text = SUMMARY_MESSAGE_PREFIX + summary.text + refs.summary_note(summary.cutoff_message_id)
    message: dict[str, Any] = {"role": ADDED_ROLE, "content": text}
    tokens = count(ADDED_ROLE, text, encoding)
    items = stored_items(summary.provider_items)
    if not items or text_only:
        return message, tokens
    if model and all(reasoning.same_model(item, model) for item in items):
        message[SUMMARY_ITEMS_KEY] = items
        return message, max(tokens, sum(reasoning.item_tokens(item) for item in items))
    message[reasoning.LEFT_OUT_KEY] = len(items)
    return message, tokens


def context_message(file: ContextFile) -> dict[str, Any]:
    """A context file as the user message that shows it."""
    return {"role": ADDED_ROLE, "content": f"[Context file: {file.name}]\n{file.text}"}


def after_cutoff(
    messages: Sequence[Msg], summary: SummaryRec | None, root: Msg | None
) -> Sequence[Msg]:
    """The messages a summary does not cover (all of them without one)."""
    if summary is None or (root is not None and root.id == summary.cutoff_message_id):
        return messages
    for index, message in enumerate(messages):
        if message.id == summary.cutoff_message_id:
            return messages[index + 1 :]
    raise InputError(
        f"summary {summary.id} covers message {summary.cutoff_message_id}, "
        "which is not on this branch"
    )


def fixed_part_tokens(
    branch: Sequence[Msg], request: RequestSpec, *, model: str
) -> tuple[int, int, int, int]:
    """Tokens of the system prompt (the request's, else the stored root), the tools, the
    reminder and all the context files the request gives, counted as ``assemble`` counts them
    (cached): the request profile records them even for a request that does not fit."""
    encoding = tokens.encoding_name_for(model)
    _, system_tokens = system_part(stored_prompt(branch), request.system, encoding)
    reminder = request.reminder
    reminder_tokens = count(ADDED_ROLE, reminder, encoding) if reminder else 0
    files = sum(
        count(ADDED_ROLE, context_message(f)["content"], encoding) for f in request.context_files
    )
    return system_tokens, tools_tokens(request.tools, encoding), reminder_tokens, files
