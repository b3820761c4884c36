"""Native upstream dialects and the thinking policy.

- ``native_items_byte_identical``: a reasoning-and-tools conversation of 40 requests through
  `recap serve` with ``RECAP_UPSTREAM_DIALECT=native`` and every turn's reasoning kept, driven by
  the openai client against the validating stand-in (``tests.support.native_upstream``), two
  models taking turns: of every sealed item (encrypted reasoning, web search items) the
  upstream made, and every later request for the model that made it, the share that carried
  the item's exact bytes (bound: 1.0); requests the upstream refused are counted apart
  (``native_upstream_refusals``, bound 0).
- ``thinking_tokens_vs_keep_all``: a reasoning-heavy agent run (20 user turns of 3 tool calls,
  every assistant message with a provider reasoning item of 300-900 tokens) replayed one request
  per step and assembled with the default thinking window (the turn in progress) and with every
  turn's reasoning kept: the reasoning tokens sent in all over those of keeping all.
- ``thinking_cache_cost_vs_keep_all``: the same requests priced as a prompt cache bills them
  (the longest prefix shared with the request before read at 0.1x, the rest written at 1.25x):
  the policy's cost over keeping all. Dropping a finished turn's reasoning breaks the prefix
  from that turn on once per user turn; the figure says whether the tokens saved pay for it.
- ``provider_compaction_fallback_ok``: provider compaction on, forced runs through the Python
  API while the stand-in's compaction succeeds, fails (HTTP 500) or answers without a
  compaction item: the share of runs after which the summary stands and the next request for
  each model carries what it should (bound: 1.0).
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path
from typing import Any

from bench import Figure
from recap.core.counting import tokens
from recap.core.request.assembly import StoredBranch, Target, assemble
from recap.core.values.records import Msg
from recap.core.values.request import RequestSpec

MODEL = "openai/gpt-5"
WINDOW = 2_000_000  # the whole run fits: the figures are about reasoning, not truncation
READ, WRITE = 0.1, 1.25  # a prompt cache's prices against the base input price
TURNS, STEPS = 20, 3
SEED = 40


def _item(rng: random.Random, n: int) -> dict[str, Any]:
    size = rng.randint(300, 900)
    raw = json.dumps({"type": "reasoning", "id": f"rs_{n}", "encrypted_content": "x" * size * 3})
    return {"provider": "openai", "model": MODEL, "kind": "reasoning", "at": 0, "raw": raw}


def agent_run() -> list[dict[str, Any]]:
    """The reasoning-heavy run (see the module's docstring), as chat messages."""
    rng = random.Random(SEED)
    out: list[dict[str, Any]] = []
    for turn in range(TURNS):
        out.append(
            {"role": "user", "content": f"Task {turn}: fix the failing check in module {turn}."}
        )
        for step in range(STEPS):
            call_id = f"call_{turn}_{step}"
            arguments = json.dumps({"path": f"src/m{turn}.py", "step": step})
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": "read", "arguments": arguments},
            }
            item = {**_item(rng, len(out)), "tokens": rng.randint(300, 900)}
            out.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [call],
                    "provider_items": [item],
                }
            )
            out.append(
                {"role": "tool", "tool_call_id": call_id, "content": f"line {step}: ok " * 40}
            )
        item = {**_item(rng, len(out)), "tokens": rng.randint(300, 900)}
        out.append(
            {"role": "assistant", "content": f"Fixed module {turn}.", "provider_items": [item]}
        )
    return out


def _branch(messages: list[dict[str, Any]]) -> list[Msg]:
    encoding = tokens.encoding_name_for(MODEL)
    branch = []
    for index, message in enumerate(messages):
        extra = (
            {"provider_items": message["provider_items"]} if "provider_items" in message else None
        )
        branch.append(
            Msg(
                id=index + 1,
                parent_id=index or None,
                role=message["role"],
                content=message.get("content"),
                tokens=tokens.count_message(message, encoding, model=MODEL),
                tool_calls=tuple(message.get("tool_calls") or ()),
                tool_call_id=message.get("tool_call_id"),
                extra=extra,
            )
        )
    return branch


def _costs(branch: list[Msg], thinking_turns: int) -> tuple[int, float]:
    """The reasoning tokens sent over every step's request, and their cache-priced cost."""
    encoding = tokens.encoding_name_for(MODEL)
    target = Target(model=MODEL, window=WINDOW, safety_margin=0.0, thinking_turns=thinking_turns)
    reasoning, cost = 0, 0.0
    previous: list[str] = []
    for end in range(1, len(branch) + 1):
        if branch[end - 1].role == "assistant":
            continue  # a request is made after a user message or a tool result
        result = assemble(StoredBranch(branch=branch[:end]), RequestSpec(), target=target)
        reasoning += result.tokens.reasoning
        rendered = [json.dumps(m, sort_keys=True) for m in result.messages]
        sizes = [tokens.count_message(m, encoding) for m in result.messages]
        shared = 0
        for index, (now, before) in enumerate(zip(rendered, previous, strict=False)):
            if now != before:
                break
            shared += sizes[index]
        total = sum(sizes)
        cost += shared * READ + (total - shared) * WRITE
        previous = rendered
    return reasoning, cost


def byte_identity() -> tuple[float, int]:
    """The share of due item resends that carried the item's exact bytes, and the refusals."""
    import openai

    from tests.support.native_upstream import Running
    from tests.support.serving import KEY_A, running_serve

    upstream = Running()
    folder = Path(tempfile.mkdtemp(prefix="recap-bench-native-"))
    try:
        with running_serve(
            f"sqlite:///{folder / 'recap.db'}",
            folder,
            upstream,  # type: ignore[arg-type]
            RECAP_UPSTREAM_DIALECT="native",
            RECAP_THINKING_TURNS="1000",
        ) as serve:
            client = openai.OpenAI(base_url=serve.base_url, api_key=KEY_A, max_retries=0)
            previous = None
            for turn in range(20):
                model = "openai/stand-b" if turn % 3 == 2 else "openai/stand-a"
                reply = client.responses.create(
                    model=model,
                    input=f"use tool in bench turn {turn}",
                    previous_response_id=previous,
                )
                call = next(item for item in reply.output if item.type == "function_call")
                output: Any = {
                    "type": "function_call_output",
                    "call_id": call.call_id,
                    "output": "1",
                }
                reply = client.responses.create(
                    model=model, input=[output], previous_response_id=reply.id
                )
                previous = reply.id
        requests = upstream.state.requests
        due = identical = 0
        for index, request in enumerate(requests):
            sent = request.raw.decode()
            for earlier in requests[:index]:
                if earlier.body.get("model") != request.body.get("model"):
                    continue
                for item in earlier.made:
                    due += 1
                    identical += item in sent
        return (identical / due if due else 0.0), sum(1 for r in requests if r.status != 200)
    finally:
        upstream.stop()


COMPACTION_MODES = ("", "http", "shape", "", "http", "shape")  # "": the compaction succeeds


def compaction_fallback() -> float:
    """Provider compaction on (``tests.support.native_upstream.compacted_host_run``): the share
    of runs whose outcome holds - a summary written, the next request for the same model and
    for another accepted by the validating upstream with the newest turn in it, the provider's
    item sent to the same model exactly when its compaction succeeded, never to the other."""
    from tests.support.native_upstream import Running, compacted_host_run

    upstream = Running()
    held = 0
    try:
        for mode in COMPACTION_MODES:
            folder = tempfile.mkdtemp(prefix="recap-bench-compaction-")
            run = compacted_host_run(upstream.state, upstream.url, folder, mode)
            (status_a, _r, sent_a), (status_b, _s, sent_b) = run["sent"].values()
            item = '"type":"compaction"'
            held += (
                run["action"] == "summarized"
                and status_a == status_b == 200
                and "what now?" in sent_a
                and "what now?" in sent_b
                and (item in sent_a) == (mode == "")
                and item not in sent_b
            )
    finally:
        upstream.stop()
    return held / len(COMPACTION_MODES)


def run(_data: Any = None) -> list[Figure]:
    branch = _branch(agent_run())
    policy_tokens, policy_cost = _costs(branch, 1)
    all_tokens, all_cost = _costs(branch, 1_000)
    share, refusals = byte_identity()
    fallback = compaction_fallback()
    return [
        Figure(
            "native_items_byte_identical",
            round(share, 4),
            ">= 1",
            "40 native Responses requests through serve, two models: due item resends "
            "carrying the item's exact bytes",
        ),
        Figure(
            "native_upstream_refusals",
            refusals,
            "== 0",
            "requests of that run the validating upstream refused (a changed or misplaced item)",
        ),
        Figure(
            "provider_compaction_fallback_ok",
            round(fallback, 4),
            ">= 1",
            f"{len(COMPACTION_MODES)} forced runs with RECAP_PROVIDER_COMPACTION=auto, the "
            "provider's compaction succeeding, failing with HTTP 500 or answering no item: "
            "runs whose summary, next requests (same model: the item exactly when it succeeded; "
            "another: never) and newest turn held",
        ),
        Figure(
            "thinking_tokens_vs_keep_all",
            round(policy_tokens / all_tokens, 4),
            "",
            "reasoning tokens sent over a 20-turn tool run, default thinking window over "
            "every turn's kept",
        ),
        Figure(
            "thinking_cache_cost_vs_keep_all",
            round(policy_cost / all_cost, 4),
            "",
            "the same requests priced with a prompt cache (0.1x read, 1.25x write): default "
            "window over keep-all",
        ),
    ]
