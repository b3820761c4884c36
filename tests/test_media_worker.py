"""Vision-style conversations through the whole pipeline: import (screenshots stored out of the
row), assemble (older screenshots aged), a real Celery worker compressing over Redis and over
RabbitMQ with litellm calling the local model server (the summarizer reads media as text, never
base64), the request after the summary, and an export round trip that gives the original bytes
back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recap.core import service
from recap.core.summaries.prompts import SUMMARY_MESSAGE_PREFIX
from tests import test_compress_worker
from tests.support.cli_helpers import recap
from tests.test_compress_worker import Harness
from tests.test_media import screenshot_turns

pytestmark = pytest.mark.redis
broker = test_compress_worker.broker  # the worker tests' fixtures, shared
harness = test_compress_worker.harness

TURNS = 12  # screenshots; at a 20k window their text plus two images goes over the trigger
WINDOW = 20_000


def _conversation(turns: int) -> list[dict[str, object]]:
    messages = screenshot_turns(turns)
    for n, message in enumerate(messages[2::2]):  # longer answers: the history needs a summary
        message["content"] = f"Step {n}: " + " ".join(f"observation{n}_{i}" for i in range(80))
    return messages


def test_vision_conversation_through_import_worker_and_export(
    harness: Harness, tmp_path: Path
) -> None:
    """Every stage with real screenshots: stored out of the row, aged in the request, described
    to the summarizer, gone from the request once summarized, and exported byte for byte."""
    messages = _conversation(TURNS)
    path = tmp_path / "vision.jsonl"
    path.write_text(json.dumps({"id": "vision", "messages": messages}) + "\n")
    imported = recap("import", str(path), "--model", "gpt-4o", "--max-input-tokens", str(WINDOW))
    assert imported.code == 0, imported.stderr
    assert len([p for p in (tmp_path / "outputs").rglob("*.txt")]) == TURNS

    before = service.assemble(harness.engine, "vision", harness.settings)
    assert before.tokens.media == 2 * 1105
    sent = json.dumps(before.messages)
    assert sent.count('"type": "image_url"') == 2 and "screenshot-0.png, 1280x800, removed" in sent

    done = harness.compress("vision", force=True)
    assert done["action"] == "summarized", done
    read = "\n".join(request.text for request in harness.server.requests)
    assert "[image: screenshot-0.png, 1280x800]" in read
    assert "base64" not in read and "recap-media:" not in read

    after = service.assemble(harness.engine, "vision", harness.settings)
    assert after.summary_id == done["summary_id"]
    assert after.messages[1]["content"].startswith(SUMMARY_MESSAGE_PREFIX)
    assert after.tokens.total < before.tokens.total
    assert json.dumps(after.messages).count('"type": "image_url"') <= harness.settings.keep_media

    exported = json.loads(recap("export", "vision", "--full").stdout)["messages"]
    assert [{k: v for k, v in m.items() if k != "id"} for m in exported] == messages
