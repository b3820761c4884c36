"""Which provider a litellm model string names: the one place a model string is read for it.

Media counting (``media.image_rule_of``) and reasoning (``reasoning.family_of``) each map the
provider to the rule they apply: a Gemini model has its own image rule but OpenAI's reasoning
fields; DeepSeek has its own reasoning field (except R1, which follows OpenAI's) but OpenAI's
image rule.
"""

from __future__ import annotations

OPENAI = "openai"
ANTHROPIC = "anthropic"
GEMINI = "gemini"
DEEPSEEK = "deepseek"


def provider_of(model: str | None) -> str:
    """The provider of a litellm model string (``OPENAI`` for anything not recognized)."""
    name = (model or "").lower()
    if name.startswith("anthropic/") or "claude" in name:
        return ANTHROPIC
    if name.startswith(("gemini/", "vertex_ai/gemini")) or "gemini" in name:
        return GEMINI
    if name.rsplit("/", 1)[-1].startswith("deepseek"):
        return DEEPSEEK
    return OPENAI


def model_name(model: str | None) -> str:
    """The model's own name, without the litellm provider prefix, lower case."""
    return (model or "").lower().rsplit("/", 1)[-1]
