"""The rules: one per field, each a ``Check`` (a value and the path naming it, raising a 400
``ServeError`` that names the path and what the field must be).

Numbers are numbers: a boolean, a string spelling a number ("0.5", "NaN", "1e999") or a
non-finite float is refused wherever a number is taken, and each sampling parameter keeps to
the range every provider takes. ``PARAM_CHECKS`` is the table of chat completions' forwarded
parameters; the other APIs check their fields of the same meaning with the same entries.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from typing import Any

from recap.workers.serve.bounded import INT_MIN
from recap.workers.serve.errors import ServeError, bad_request

Check = Callable[[Any, str], None]

SAMPLING_TEMPERATURE = (0.0, 2.0)  # OpenAI's range; Anthropic's (0 to 1) lies inside it
NUCLEUS = (0.0, 1.0)  # top_p is a probability
PENALTY = (-2.0, 2.0)  # presence and frequency penalties, as OpenAI documents them
MAX_TOP_LOGPROBS = 20  # OpenAI returns at most 20 alternatives per token
CACHE_TTLS = ("5m", "1h")  # Anthropic's cache lifetimes


# the content part types a chat message (and a reply) may hold
PART_TYPES = frozenset(
    {"text", "refusal", "image_url", "input_audio", "file", "thinking", "redacted_thinking"}
)


def refuse(path: str, what: str) -> ServeError:
    """The 400 for a field that is not what it must be; ``param`` is its top-level name."""
    top = path.split(".")[0].split("[")[0]
    return bad_request(f"`{path}` must be {what}.", param=top)


def short(value: Any) -> str:
    """A value as an error shows it: at most 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


# --- kinds of value ------------------------------------------------------------------------------


def number(low: float | None = None, high: float | None = None) -> Check:
    """A finite JSON number (never a boolean or a string), within ``low``..``high``."""
    if low is not None and high is not None:
        what = f"a finite number from {low:g} to {high:g}"
    else:
        what = "a finite number"

    def check(value: Any, path: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise refuse(path, what)
        if not math.isfinite(value):
            raise refuse(path, what)
        if (low is not None and value < low) or (high is not None and value > high):
            raise refuse(path, what)

    return check


def integer(low: int, high: int | None = None) -> Check:
    """A JSON integer (never a boolean, a float or a string) of at least ``low``."""
    what = f"an integer of at least {low}" if high is None else f"an integer from {low} to {high}"

    def check(value: Any, path: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise refuse(path, what)
        if high is not None and value > high:
            raise refuse(path, what)

    return check


def of(kind: type | tuple[type, ...], what: str) -> Check:
    def check(value: Any, path: str) -> None:
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise refuse(path, what)

    return check


def one_of(*choices: str) -> Check:
    what = "one of " + ", ".join(repr(c) for c in choices)

    def check(value: Any, path: str) -> None:
        if not isinstance(value, str) or value not in choices:
            raise refuse(path, what)

    return check


def optional(rule: Check) -> Check:
    """``rule``, or null (an optional field given as null is a field not given)."""

    def check(value: Any, path: str) -> None:
        if value is not None:
            rule(value, path)

    return check


string = of(str, "a string")
boolean = of(bool, "true or false")
obj = of(dict, "an object")


def name(value: Any, path: str) -> None:
    """An id or a name: a non-empty string."""
    if not isinstance(value, str) or not value:
        raise refuse(path, "a non-empty string")


def strings(value: Any, path: str) -> None:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise refuse(path, "a list of strings")


def objects(value: Any, path: str) -> None:
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise refuse(path, "a list of objects")


def non_empty_list(value: Any, path: str) -> None:
    if not isinstance(value, list) or not value:
        raise refuse(path, "a non-empty list")


def stop(value: Any, path: str) -> None:
    if not isinstance(value, str):
        strings(value, path)


def bias(value: Any, path: str) -> None:
    if not isinstance(value, dict):
        raise refuse(path, "an object of token ids to numbers")
    for token, weight in value.items():
        number(-100, 100)(weight, f"{path}.{token}")


def anything(value: Any, path: str) -> None:
    return None


def fields(value: Mapping[str, Any], path: str, rules: Mapping[str, Check]) -> None:
    """Each of ``rules``' fields that ``value`` has (null where the rule allows it)."""
    for key, rule in rules.items():
        if key in value:
            rule(value[key], f"{path}.{key}" if path else key)


def required(value: Mapping[str, Any], path: str, keys: Collection[str]) -> None:
    for key in keys:
        if key not in value:
            raise refuse(f"{path}.{key}" if path else key, "given (it is required)")


# --- shared shapes -------------------------------------------------------------------------------


def function_definition(value: Any, path: str) -> None:
    """A function a model may call, however the API spells its place: a non-empty name, a
    string description, an object schema (``parameters``, Anthropic's ``input_schema``)."""
    obj(value, path)
    required(value, path, ("name",))
    fields(
        value,
        path,
        {
            "name": name,
            "description": optional(string),
            "parameters": optional(obj),
            "input_schema": optional(obj),
            "strict": optional(boolean),
        },
    )


def chat_tools(value: Any, path: str) -> None:
    """Chat completions' tools: objects, each function tool's function well-formed."""
    objects(value, path)
    for index, tool in enumerate(value):
        if tool.get("type", "function") == "function":
            function_definition(tool.get("function"), f"{path}[{index}].function")


def chat_tool_choice(value: Any, path: str) -> None:
    """A string (auto, none, required) or an object naming a function by a string name."""
    if isinstance(value, str):
        return
    obj(value, path)
    if value.get("type") == "function":
        function = value.get("function")
        obj(function, f"{path}.function")
        name(function.get("name"), f"{path}.function.name")


def metadata(value: Any, path: str) -> None:
    """An object; the conversation it may name (``recap_conversation``) a string."""
    obj(value, path)
    fields(value, path, {"recap_conversation": optional(string)})


def cache_control(value: Any, path: str) -> None:
    """Anthropic's cache mark: ``{"type": "ephemeral"}`` with an optional ``ttl``."""
    obj(value, path)
    required(value, path, ("type",))
    fields(value, path, {"type": one_of("ephemeral"), "ttl": optional(one_of(*CACHE_TTLS))})


def json_schema_format(value: Any, path: str) -> None:
    fields(
        value,
        path,
        {
            "name": optional(string),
            "schema": obj,
            "strict": optional(boolean),
            "description": optional(string),
        },
    )
    required(value, path, ("schema",))


# --- chat completions' forwarded parameters ------------------------------------------------------

PARAM_CHECKS: dict[str, Check] = {
    "audio": obj,
    "frequency_penalty": number(*PENALTY),
    "function_call": of((str, dict), "a string or an object"),
    "functions": objects,
    "logit_bias": bias,
    "logprobs": boolean,
    "max_completion_tokens": integer(0),
    "max_tokens": integer(0),
    "modalities": strings,
    "n": integer(1),
    "parallel_tool_calls": boolean,
    "prediction": obj,
    "presence_penalty": number(*PENALTY),
    "prompt_cache_key": string,  # a client's own caching hints (upstream.CACHE_PARAMS)
    "prompt_cache_retention": string,
    "reasoning_effort": string,
    "response_format": obj,
    "seed": integer(INT_MIN),
    "service_tier": string,
    "stop": stop,
    "temperature": number(*SAMPLING_TEMPERATURE),
    "tool_choice": chat_tool_choice,
    "tools": chat_tools,
    "top_logprobs": integer(0, MAX_TOP_LOGPROBS),
    "top_p": number(*NUCLEUS),
    "user": string,
    "verbosity": string,
    "web_search_options": obj,
}
