"""The Agents SDK adapter takes its own assembly as the call's input when the conversation's head
is the input's last item, even when Recap sent that message's image as a placeholder (a
screenshot that cannot fit the window in its own turn): it used to take that for an input of the
SDK's own and send the SDK's whole history, image and all (3,639 provider tokens into 3,000 in
the doors' session of seed 105, with no reading recorded)."""

from __future__ import annotations

import pytest

pytest.importorskip("agents", reason="the openai-agents extra is not installed")

from recap.convert import openai_agents as convert
from recap.integrations._agents_model import _same_item

IMAGE = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAABAAAAAQACAAAAAA"
GIVEN = {
    "role": "user",
    "content": [
        {"type": "input_text", "text": "turn 2: here is the label"},
        {"type": "input_image", "image_url": IMAGE, "detail": "auto"},
    ],
}


def assembled(parts: list[dict[str, str]]) -> dict[str, object]:
    """The head message as Recap's assembly hands it to the SDK."""
    (item,) = convert.messages_to_items([{"role": "user", "content": parts}])
    return item


def test_the_head_with_its_image_sent_as_a_placeholder_is_the_same_item() -> None:
    aged = assembled(
        [
            {"type": "text", "text": "turn 2: here is the label"},
            {"type": "text", "text": "[image: image-1.png, 1024x1024, removed to save context]"},
        ]
    )
    assert _same_item(aged, GIVEN)


def test_another_message_is_not_the_same_item() -> None:
    other = assembled(
        [
            {"type": "text", "text": "turn 2: another label"},
            {"type": "text", "text": "[image: image-1.png, 1024x1024, removed to save context]"},
        ]
    )
    assert not _same_item(other, GIVEN)
    assert not _same_item(assembled([{"type": "text", "text": "turn 2: here is the label"}]), GIVEN)


def test_the_head_sent_whole_is_the_same_item() -> None:
    whole = assembled(
        [
            {"type": "text", "text": "turn 2: here is the label"},
            {"type": "image_url", "image_url": {"url": IMAGE, "detail": "auto"}},
        ]
    )
    assert _same_item(whole, GIVEN)
