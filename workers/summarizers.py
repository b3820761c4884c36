"""The summarizers a compression run calls, with no session held: one protocol, two strategies.

``ModelSummarizer`` asks the configured litellm model (``workers.llm``) for a summary: in one call
on the chat's last request where the run built it again (``core.compression.prefix``, so the
provider's prompt cache serves most of the input), else a chunked progressive summary; within the
run's deadline, re-asking once when identifiers were lost;
``ExtractiveSummarizer`` is the offline one (``core.summaries.extractive``). ``summarizer_for``
picks one from the settings. A summarizer returns the summary's text and usage, or raises
``SummaryFailed`` (nothing is stored) or ``RetryLater`` (a model error worth retrying).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

from recap.core import overflow
from recap.core.compression.report import log
from recap.core.compression.summarizer import EXTRACTIVE_MODEL as EXTRACTIVE_MODEL
from recap.core.compression.summarizer import ExtractiveSummarizer as ExtractiveSummarizer
from recap.core.compression.summarizer import OutOfTime as OutOfTime
from recap.core.compression.summarizer import RetryLater as RetryLater
from recap.core.compression.summarizer import Summarizer as Summarizer
from recap.core.compression.summarizer import SummaryFailed as SummaryFailed
from recap.core.compression.summarizer import SummaryText as SummaryText
from recap.core.counting import tokens
from recap.core.decision import policy
from recap.core.request.assembly.parts import tools_tokens
from recap.core.settings import Settings
from recap.core.summaries import onprefix, planning, sizing
from recap.core.summaries.identifiers import identifiers_of_span, retention
from recap.core.summaries.planning import Rendered, Split
from recap.core.summaries.prompts import RETENTION_REMINDER

if TYPE_CHECKING:
    from types import ModuleType

MAX_SHRINKS = 6  # a context-window error halves the chunks sent, down to the smallest chunk
# An unknown summary model (a local model, a proxy alias) is assumed to take 8k tokens, which any
# current chat model does; a context-window error from it halves the chunks it is sent.
FALLBACK_SUMMARIZER_WINDOW = 8_192
COUNT_CACHE_SIZE = 4_096  # rendered messages whose token counts are kept
# A model call is started only with this much of the run's time left (less when RECAP_LLM_TIMEOUT
# or half the run is less): a summary cut off by the deadline is paid for and thrown away.
CALL_FLOOR_SECONDS = 10
SHORTER = (
    "Keep the whole summary within about {tokens} tokens: the conversation's window is small, "
    "and the summary must leave room for the newest turns."
)
DEADLINE_SLACK_SECONDS = 0.5  # a timeout this close to the deadline is the deadline's doing
REASK_ROOM = 64  # beside the listed identifiers, the re-ask's reminder on the chat's prefix


def summarizer_for(settings: Settings, attempt: int, deadline: float) -> Summarizer:
    """``Summarizers`` of the workers: the configured model's summarizer for this attempt and
    deadline, else the offline one."""
    if settings.summary_model:
        return ModelSummarizer(settings, attempt=attempt, deadline=deadline)
    return ExtractiveSummarizer()


REFUSED_SHARE = 0.75  # an unstated window is taken as this share of the refused request's size


def smaller_window(window: int, stated: int | None, sent: int | None) -> int:
    """The window to plan the next call with after a context-length refusal: the one the
    provider's error states; else three quarters of what the refused request took (or of the
    window, when that is not known)."""
    if stated is not None and stated < window:
        return stated
    return int(min(window, sent or window) * REFUSED_SHARE)


def summarizer_window(settings: Settings) -> int:
    """The summary model's input window from litellm's map, else a conservative guess."""
    entry = tokens.model_info(settings.summary_model or "")
    return int(entry["max_input_tokens"]) if entry else FALLBACK_SUMMARIZER_WINDOW


@lru_cache(maxsize=COUNT_CACHE_SIZE)
def _count_cached(role: str, content: str, encoding: str) -> int:
    return tokens.count_message({"role": role, "content": content}, encoding)


def _counter(encoding: str) -> planning.Counter:
    """Tokens of a rendered message; the prompt, marker, reminder and recent context repeat
    from run to run, so counts are cached by text."""
    return lambda message: _count_cached(
        str(message.get("role", "")), str(message.get("content") or ""), encoding
    )


def _usable(text: str) -> bool:
    return planning.rejection_reason(text, summary_tokens=0, replaced_tokens=1) is None


class ModelSummarizer:
    """Chunked progressive summary by the configured model; one re-ask when identifiers are lost.

    ``summarize`` raises ``RetryLater`` for a retryable error with attempts left,
    ``SummaryFailed`` otherwise (``OutOfTime`` when the run's deadline leaves no room for a call).
    """

    def __init__(self, settings: Settings, *, attempt: int, deadline: float) -> None:
        self.settings = settings
        self.attempt = attempt
        self.deadline = deadline  # time.monotonic() by which the run ends
        self.asked: int | None = None  # the size each call asks for, when less than the cap
        self.count: planning.Counter = _counter("o200k_base")  # the summary model's, once known

    def summarize(self, snapshot: policy.Snapshot, split: Split) -> SummaryText:
        from recap.workers import llm

        settings = self.settings
        window = summarizer_window(settings)
        for _shrink in range(MAX_SHRINKS + 1):
            try:
                return self._chunks(llm, snapshot, split, window)
            except llm.ContextTooLongError as exc:
                # the window is learnt from the refusal, so every part of the request shrinks
                # (halving the chunks alone left the prompt, summary and recent context as they
                # were, so call after call was refused at nearly the same size)
                window = smaller_window(window, overflow.stated_limit(exc), exc.sent_tokens)
            except llm.RetryableLLMError as exc:
                if self.attempt + 1 >= settings.max_attempts:
                    raise SummaryFailed(
                        f"gave up after {self.attempt + 1} attempts: {exc}"
                    ) from exc
                delay = llm.backoff_seconds(self.attempt, settings.retry_backoff_max)
                raise RetryLater(str(exc), delay) from exc
            except llm.LLMError as exc:
                raise SummaryFailed(f"the summarizer failed: {exc}") from exc
            except planning.SummarizerWindowError as exc:
                raise SummaryFailed(str(exc)) from exc
        raise SummaryFailed("the summarizer's input did not fit its window even in small chunks")

    def _chunks(
        self,
        llm: ModuleType,
        snapshot: policy.Snapshot,
        split: Split,
        window: int,
    ) -> SummaryText:
        settings = self.settings
        count = self.count = _counter(
            tokens.encoding_name_for(settings.summary_model or snapshot.model)
        )
        if split.prefix is not None:
            done = self._on_prefix(llm, snapshot, split, window, count)
            if done is not None:
                return done
        names = planning.tool_names(snapshot.branch)
        older = planning.render_messages(
            split.older,
            names=names,
            result_chars=planning.OLDER_RESULT_CHARS,
            clearings=snapshot.clearings,
        )
        recent = planning.render_messages(
            split.recent,
            names=names,
            result_chars=planning.RECENT_RESULT_CHARS,
            clearings=snapshot.clearings,
        )
        previous = snapshot.summary.text if snapshot.summary else None
        # the most the summary may take (its room in the request, within the cap): asked for in
        # the prompt and as the reply's limit, with a quarter more so a line can end; the run
        # cuts whatever is still over it (core.summaries.sizing)
        # (and never over a third of the summarizer's own window, so a small one holds a chunk)
        cap = settings.summary_max_output_tokens
        limit = sizing.summary_limit(split.summary_room, cap)
        max_output = min(cap, limit + limit // 4, window // 3)
        self.asked = min(limit, max_output) if min(limit, max_output) < cap else None
        plan = planning.plan_summary(
            older=older,
            recent=recent,
            prompt=settings.summary_prompt,
            previous_summary_tokens=snapshot.summary.tokens if snapshot.summary else 0,
            window=window,
            max_output_tokens=max_output,
            count=count,
        )
        result = SummaryText(text=previous or "", model=settings.summary_model or "", retention=0)
        seed: str | None = None
        for index, chunk in enumerate(plan.chunks):
            last = index == len(plan.chunks) - 1
            seed = result.text or None
            messages = planning.build_summary_messages(
                prompt=settings.summary_prompt,
                previous_summary=seed,
                older=chunk,
                recent=plan.recent if last else (),
            )
            self._call(llm, messages, result, plan.max_output_tokens)
            if not last and not _usable(result.text):
                raise SummaryFailed(
                    f"chunk {index + 1} of {len(plan.chunks)} gave no usable summary"
                )
        wanted = identifiers_of_span(split.older)
        score = retention(wanted, result.text)
        result.retention = score.score
        floor = settings.identifier_retention_floor
        if _usable(result.text) and score.score < floor and score.missing:
            try:
                self._reask(llm, result, plan, seed, score.missing, wanted, count)
            except OutOfTime:  # the first summary stands; the re-ask only ever improves on it
                log.info("retention_reask_skipped", conversation_id=snapshot.conversation_id)
        return result

    def _on_prefix(
        self,
        llm: ModuleType,
        snapshot: policy.Snapshot,
        split: Split,
        window: int,
        count: planning.Counter,
    ) -> SummaryText | None:
        """The summary by one call on the chat's last request (``core.summaries.onprefix``),
        re-asked once on it when identifiers were lost; None where that request cannot serve
        (the span is not where it begins, or it and the reply do not fit the summarizer's
        window): the chunked request shape then."""
        assert split.prefix is not None
        settings = self.settings
        request = onprefix.on_prefix(
            split.prefix,
            model=split.prefix.model,
            summary_id=snapshot.summary.id if snapshot.summary else None,
            span=[m.id for m in split.older],
            prompt=settings.summary_prompt,
        )
        if request is None:
            return None
        cap = settings.summary_max_output_tokens
        limit = sizing.summary_limit(split.summary_room, cap)
        max_output = min(cap, limit + limit // 4, window // 3)
        encoding = tokens.encoding_name_for(settings.summary_model or snapshot.model)
        size = sum(count(m) for m in request.messages) + tools_tokens(request.tools, encoding)
        if size + max_output + planning.RETENTION_LIST_TOKENS + REASK_ROOM > window:
            return None
        self.asked = min(limit, max_output) if min(limit, max_output) < cap else None
        result = SummaryText(text="", model=settings.summary_model or "", retention=0)
        self._call(llm, request.messages, result, max_output, request)
        wanted = identifiers_of_span(split.older)
        score = retention(wanted, result.text)
        result.retention = score.score
        if not _usable(result.text) or score.score >= settings.identifier_retention_floor:
            return result
        if not score.missing:
            return result
        listed = planning.missing_within(score.missing, planning.RETENTION_LIST_TOKENS, count)
        missing = RETENTION_REMINDER + "\n" + "\n".join(f"- {m}" for m in listed)
        instruction = request.messages[-1]
        again = [
            *request.messages[:-1],
            {**instruction, "content": f"{instruction['content']}\n\n{missing}"},
        ]
        first_text, first_score = result.text, result.retention
        try:
            self._call(llm, again, result, max_output, request)
        except OutOfTime:  # the first summary stands; the re-ask only ever improves on it
            log.info("retention_reask_skipped", conversation_id=snapshot.conversation_id)
            result.text = first_text
            return result
        second = retention(wanted, result.text).score
        if _usable(result.text) and second > first_score:
            result.retention = second
        else:
            result.text, result.retention = first_text, first_score
        return result

    def _call(
        self,
        llm: ModuleType,
        messages: list[Rendered],
        into: SummaryText,
        max_output: int,
        on: onprefix.PrefixRequest | None = None,
    ) -> None:
        """One summarizer call within the run's deadline, its reply and usage added to ``into``
        (``on``: a request on the chat's prefix, sent with its tools and caching hints)."""
        settings, deadline = self.settings, self.deadline
        if self.asked is not None:  # asked shorter: the summary must leave the newest turns room
            shorter = SHORTER.format(tokens=self.asked)
            messages = [
                *messages[:-1],
                {**messages[-1], "content": f"{messages[-1]['content']}\n\n{shorter}"},
            ]
        left = deadline - time.monotonic()
        if left < min(settings.llm_timeout, CALL_FLOOR_SECONDS, settings.run_seconds / 2):
            raise OutOfTime(
                f"the run's time is up: {max(left, 0):.0f} s of its {settings.run_seconds} s "
                "(RECAP_TASK_TIME_LIMIT) left, too little for a summarizer call"
            )
        try:
            reply = llm.complete(
                messages,
                settings,
                max_tokens=max_output,
                timeout=left,
                tools=on.tools if on is not None else (),
                cache_params=on.cache_params if on is not None else None,
            )
        except llm.ContextTooLongError as exc:
            exc.sent_tokens = sum(self.count(m) for m in messages) + max_output
            raise
        except llm.RetryableLLMError as exc:
            late = time.monotonic() >= deadline - DEADLINE_SLACK_SECONDS
            if left < settings.llm_timeout and late:
                raise OutOfTime(
                    f"the run's time ran out during a summarizer call cut to {left:.0f} s by its "
                    f"{settings.run_seconds} s budget (RECAP_TASK_TIME_LIMIT): {exc}"
                ) from exc
            raise
        into.text = reply.text
        into.input_tokens += reply.input_tokens
        into.output_tokens += reply.output_tokens
        into.cost += reply.cost
        into.cached_input_tokens += reply.cached_tokens
        into.calls += 1

    def _reask(
        self,
        llm: ModuleType,
        result: SummaryText,
        plan: planning.SummaryPlan,
        seed: str | None,
        missing: Sequence[str],
        wanted: set[str],
        count: planning.Counter,
    ) -> None:
        """Ask once more with the missing identifiers listed; keep the better of the two."""
        listed = planning.missing_within(missing, planning.RETENTION_LIST_TOKENS, count)
        messages = planning.build_summary_messages(
            prompt=self.settings.summary_prompt,
            previous_summary=seed,
            older=plan.chunks[-1],
            recent=plan.recent,
            missing=listed,
        )
        first_text, first_score = result.text, result.retention
        self._call(llm, messages, result, plan.max_output_tokens)
        second = retention(wanted, result.text).score
        if _usable(result.text) and second > first_score:
            result.retention = second
        else:
            result.text, result.retention = first_text, first_score
