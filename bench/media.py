"""Media: the bytes a vision conversation's request carries, and the counting rules' error.

``media_request_bytes_vs_naive``: a 40-turn conversation with one screenshot per turn (a
1280 x 800 PNG of about 400 KB in base64, each a different file) at a 32k window; the assembled
request's bytes over those of sending every stored image (the whole conversation as exported with
``--full``). ``media_token_error``: the largest |counted - published| / published over the
providers' worked examples, each counted from a generated PNG header through ``count_message``.
``media_six_image_error``: the issue's six-image case, the request's counted tokens against the
provider rule for what it sends (its text by tiktoken, its images by the rule).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from bench import Figure

MODEL = "gpt-4o"
WINDOW = 32_000
TURNS = 40
SIX = 6
SCREEN_PAD = 300_000  # binary bytes of random padding: 400 KB once in base64, like a screenshot
# (family model, width, height, detail, published tokens): OpenAI's "Calculating costs" examples
# and Anthropic's "Evaluate image size" table.
PUBLISHED = (
    ("gpt-4o", 1024, 1024, "high", 765),
    ("gpt-4o", 2048, 4096, "high", 1105),
    ("gpt-4o", 1024, 1024, "low", 85),
    ("anthropic/claude-3-5-sonnet-20241022", 200, 200, "auto", 54),
    ("anthropic/claude-3-5-sonnet-20241022", 1000, 1000, "auto", 1334),
    ("anthropic/claude-3-5-sonnet-20241022", 1092, 1092, "auto", 1590),
)


def _png(width: int, height: int, pad: int, seed: int) -> bytes:
    import random
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    rows = zlib.compress(b"".join(b"\0" + bytes(width) for _ in range(height)))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    padding = chunk(b"raNd", random.Random(seed).randbytes(pad)) if pad else b""
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + padding
        + chunk(b"IDAT", rows)
        + chunk(b"IEND", b"")
    )


def _part(data: bytes, detail: str = "high") -> dict[str, Any]:
    import base64

    url = "data:image/png;base64," + base64.b64encode(data).decode()
    return {"type": "image_url", "image_url": {"url": url, "detail": detail}}


def _conversation(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You operate a browser."}]
    for n in range(turns):
        text = {"type": "text", "text": f"Step {n}: here is the page now. What next?"}
        messages.append({"role": "user", "content": [text, _part(_png(1280, 800, SCREEN_PAD, n))]})
        messages.append({"role": "assistant", "content": f"Click the button labelled 'Next {n}'."})
    return messages


def _assembled(messages: list[dict[str, Any]], folder: Path) -> tuple[Any, int]:
    """The request for the conversation in a fresh database, and the naive request's bytes."""
    os.environ["RECAP_OUTPUT_DIR"] = str(folder / "outputs")
    from recap.core import service
    from recap.core.settings import load_settings
    from recap.core.storage.db import make_engine
    from recap.core.storage.migrate import upgrade
    from recap.core.storage.outputs import Ingest

    settings = load_settings(database_url=f"sqlite:///{folder / 'bench.db'}")
    engine = make_engine(settings.database_url)
    upgrade(engine)
    service.import_conversations(
        engine,
        [{"id": "vision", "messages": messages}],
        settings,
        model=MODEL,
        max_input_tokens=WINDOW,
        prepare=Ingest.from_settings(settings),
    )
    request = service.assemble(engine, "vision", settings)
    full = service.export_conversation(engine, "vision", full=True, output_dir=settings.output_dir)
    naive = [{k: v for k, v in m.items() if k != "id"} for m in full["messages"]]
    engine.dispose()
    return request, len(json.dumps(naive).encode())


def request_bytes() -> Figure:
    with tempfile.TemporaryDirectory() as folder:
        request, naive = _assembled(_conversation(TURNS), Path(folder))
    sent = len(json.dumps(request.messages).encode())
    return Figure(
        "media_request_bytes_vs_naive",
        round(sent / naive, 4),
        "<= 0.15",
        f"{TURNS} turns, one 1280x800 PNG screenshot (~400 KB base64) each, {WINDOW // 1000}k "
        f"window: the assembled request ({sent:,} bytes) over sending every stored image "
        f"({naive:,} bytes)",
    )


def token_error() -> Figure:
    from recap.core.counting import tokens

    worst = 0.0
    for model, width, height, detail, published in PUBLISHED:
        encoding = tokens.encoding_name_for(model)
        text = {"type": "text", "text": "Describe this."}
        bare = tokens.count_message({"role": "user", "content": [text]}, encoding, model=model)
        message = {"role": "user", "content": [text, _part(_png(width, height, 0, 0), detail)]}
        counted = tokens.count_message(message, encoding, model=model) - bare
        worst = max(worst, abs(counted - published) / published)
    return Figure(
        "media_token_error",
        worst,
        "== 0",
        f"largest |counted - published| / published over the {len(PUBLISHED)} worked examples "
        "of OpenAI and Anthropic, counted from a generated PNG header through count_message",
    )


def six_images() -> Figure:
    from recap.core.counting import media, tokens

    with tempfile.TemporaryDirectory() as folder:
        request, _ = _assembled(_conversation(SIX), Path(folder))
    encoding = tokens.encoding_name_for(MODEL)
    images = 0
    text_only = []
    for message in request.messages:
        content = message["content"]
        if isinstance(content, list):
            images += sum(1 for p in content if p["type"] == "image_url")
            content = [p for p in content if p["type"] == "text"]
        text_only.append({**message, "content": content})
    rule = tokens.count_messages(text_only, encoding)
    rule += images * media.openai_image_tokens(1280, 800, "high", MODEL)
    return Figure(
        "media_six_image_error",
        round(abs(request.tokens.total - rule) / rule, 4),
        "<= 0.05",
        f"the issue's six 400 KB PNGs: counted request tokens against the provider rule for what "
        f"is sent ({images} images in full, RECAP_KEEP_MEDIA turns)",
    )


def run() -> list[Figure]:
    return [request_bytes(), token_error(), six_images()]
