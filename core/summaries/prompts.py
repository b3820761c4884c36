"""Prompt texts shared by the summarizers and the request view.

Every prompt is a plain string; the ones users may replace are settings (see ``core.settings``)
and are checked for their placeholders at start.
"""

from __future__ import annotations

PREVIOUS_SUMMARY_PLACEHOLDER = "{previous_summary}"

SUMMARY_SECTIONS: tuple[str, ...] = (
    "Goal",
    "Constraints and preferences",
    "Progress",
    "Key decisions",
    "Next steps",
    "Critical context",
    "Relevant files",
)

DEFAULT_SUMMARY_PROMPT = """\
You maintain the running summary of a conversation between a user and an AI assistant that uses \
tools. The assistant will continue the conversation from your summary and the most recent \
messages only, so anything you leave out is lost to it.

The summary so far (update it: keep what still holds, drop what is stale, add what is new):
<previous_summary>
{previous_summary}
</previous_summary>

Summarize the messages before the cutoff marker. Messages after the marker are shown only as \
context: do not summarize them. Write the summary with exactly these sections:

## Goal
## Constraints and preferences
## Progress
### Done
### In progress
### Blocked
## Key decisions
## Next steps
## Critical context
## Relevant files

Keep file paths, commands, identifiers, URLs, numbers and error messages verbatim. Be concise: \
short bullet points, no preamble, no closing remarks. Write "(none)" under a section with nothing \
to say."""

CUTOFF_MARKER = (
    "=== CUTOFF: summarize everything above this line. The messages below are recent context "
    "only; do not summarize them. ==="
)

SUMMARY_REMINDER = (
    "Now write the updated summary of everything before the cutoff marker, in the required "
    "sections, keeping identifiers, paths, commands and error strings verbatim."
)

NO_PREVIOUS_SUMMARY = "(none yet: this is the first summary of the conversation)"

RETENTION_REMINDER = (
    "Your previous attempt left out these identifiers from the messages before the cutoff. Keep "
    "each one verbatim in the summary where it still matters:"
)

EXTRACTIVE_NOTE = (
    "(Extractive summary: assembled offline from the messages themselves, without a model. "
    "Quotes are verbatim and may be cut.)"
)

SUMMARY_MESSAGE_PREFIX = (
    "Summary of the earlier conversation (it replaces the messages it covers):\n\n"
)
