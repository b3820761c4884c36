"""Every model the README's `recap serve` examples name has a context window in the pinned
litellm's model map, so the example runs without ``RECAP_SERVE_MAX_INPUT_TOKENS`` (an unknown
model is refused with a 400 "unknown model")."""

from __future__ import annotations

import re
from pathlib import Path

from recap.core.counting import tokens

README = Path(__file__).resolve().parent.parent / "README.md"
MODEL = re.compile(r'model="([^"]+)"')


def test_the_readme_examples_name_models_with_a_known_window() -> None:
    names = sorted(set(MODEL.findall(README.read_text(encoding="utf-8"))))
    assert any(name.startswith("anthropic/") for name in names)
    unknown = [name for name in names if tokens.model_info(name) is None]
    assert unknown == []
