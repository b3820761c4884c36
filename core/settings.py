"""One typed, validated settings object, read from ``RECAP_*`` variables and ``.env``."""

from __future__ import annotations

import math
import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from recap.core.errors import RecapError
from recap.core.summaries.prompts import DEFAULT_SUMMARY_PROMPT, PREVIOUS_SUMMARY_PLACEHOLDER
from recap.core.values.limits import INT32_MAX

DEFAULT_BROKER_URL = "filesystem://"  # kombu's file transport: works across processes, no server
DEFAULT_PROTECTED_TOOLS = ("todo_write", "todowrite", "todo", "update_plan", "plan", "think")


class SettingsError(RecapError, ValueError):
    """A setting has an invalid value; the message names the variable and the problem."""


class Settings(BaseSettings):
    """Every knob of Recap; see the README's configuration table."""

    model_config = SettingsConfigDict(
        env_prefix="RECAP_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        allow_inf_nan=False,  # NaN would pass every bound below; infinity is never meant
    )

    database_url: str = "sqlite:///./recap.db"
    broker_url: str = DEFAULT_BROKER_URL
    broker_folder: Path = Path("./.recap/broker")
    result_backend: str | None = None
    default_model: str = "gpt-4o-mini"
    summary_model: str | None = None
    summary_api_base: str | None = None
    summary_api_key: SecretStr | None = None
    summary_max_output_tokens: int = Field(default=2_000, ge=64)
    output_dir: Path = Path("./.recap/outputs")

    trigger_ratio: float = Field(default=0.75, gt=0, lt=1)
    recent_ratio: float = Field(default=0.2, gt=0, lt=1)
    recent_min_tokens: int = Field(default=2_000, ge=0)
    recent_max_tokens: int = Field(default=8_000, ge=1)
    keep_turns: int = Field(default=2, ge=0)
    safety_margin: float = Field(default=0.05, ge=0, lt=0.5)
    # The user turns whose reasoning a request sends: the one in progress (its tool loop, which
    # Anthropic requires intact) and this many less one before it; older reasoning is cleared.
    thinking_turns: int = Field(default=1, ge=1, le=1_000)
    # The request budget (core.counting.budget): a reply needs room in windows that input and output
    # share.
    reserve_output_tokens: int = Field(default=4_096, ge=0)
    # OpenAI's `prompt_cache_retention` for each request (`assemble`, `recap serve`); None: the
    # provider's default.
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    # A ready summary waits while the cache is warm and the request fits, until its saving over
    # this many requests pays for the cache rewrite (core.decision.activation); 0: used at once.
    activation_horizon_requests: int = Field(default=4, ge=0)
    # Fixed parts (system, tools, reminder, files) assumed until the host's first assemble.
    default_fixed_tokens: int = Field(default=0, ge=0)
    # At this pressure a run is urgent: no clear-at-least gate, no cooldown wait.
    urgent_ratio: float = Field(default=0.95, gt=0, le=1)
    # A span smaller than this is never sent to the summarizer: no summary would be smaller.
    min_summary_span_tokens: int = Field(default=500, ge=0)

    idle_minutes: float = Field(default=60, gt=0)
    keep_tool_results: int = Field(default=3, ge=0)
    # After an idle gap the provider cache is cold and the whole prompt is written again anyway:
    # the cheapest moment to clear, so the idle sweep keeps fewer results in full.
    idle_keep_tool_results: int = Field(default=1, ge=0)
    protected_tools: Annotated[tuple[str, ...], NoDecode] = DEFAULT_PROTECTED_TOOLS
    clear_at_least_tokens: int = Field(default=2_000, ge=0)
    # a pressure clearing after an earlier one is weighed against a summary by the prompt cache
    # each rewrites (core.decision.policy); false: clearing always comes first, as before
    weigh_clearing: bool = True
    # The aged stage (docs/lifecycle.md): an old tool result is first sent as its head and tail
    # within this many characters (its saved file named), and cleared later; 0 turns the stage off
    # (results go straight to cleared, arguments stay whole).
    aged_result_chars: int = Field(default=4_000, ge=0)
    # The tool-call arguments of all but the last this many calls are shortened to about 200
    # characters at the moments results age or clear.
    keep_tool_arguments: int = Field(default=10, ge=0)
    max_output_lines: int = Field(default=2_000, ge=10)
    max_output_bytes: int = Field(default=50_000, ge=1_000)
    max_argument_chars: int = Field(default=2_000, ge=200)
    output_retention_days: float = Field(default=7, gt=0)
    # The compaction log (core.storage.compaction_log): skipped runs are kept this many days, every
    # run (the summaries, clearings and failures operators read) for the longer history.
    log_retention_days: float = Field(default=3, gt=0)
    log_history_days: float = Field(default=90, gt=0)
    # Media (core.counting.media): inline base64 over this many bytes is stored out of the row; only
    # the last keep_media user turns send their media in full, within the per-request caps; the
    # assembled request is kept under max_request_bytes (Gemini's 20 MB inline request limit,
    # the strictest of the common providers: Anthropic takes 32 MB, OpenAI 50 MB).
    media_inline_bytes: int = Field(default=32_768, ge=0)
    keep_media: int = Field(default=2, ge=0)
    max_media_parts: int = Field(default=20, ge=0)
    max_media_tokens: int = Field(default=16_000, ge=0)
    max_request_bytes: int = Field(default=20_000_000, ge=100_000)
    sweep_batch_size: int = Field(default=5_000, ge=1)  # ~30 ms of SQLite writing per batch

    task_time_limit: int = Field(default=300, ge=5)
    reconcile_seconds: int = Field(default=300, ge=1)
    sweep_seconds: int = Field(default=300, ge=1)
    cleanup_seconds: int = Field(default=3_600, ge=1)
    log_prune_seconds: int = Field(default=3_600, ge=1)  # how often beat prunes the log
    # Lifecycle (docs/lifecycle.md): conversations idle longer than this many days are deleted by
    # beat (`recap.expire_conversations`, every expire_seconds), rows and files; unset keeps them.
    conversation_retention_days: float | None = Field(default=None, gt=0)
    expire_seconds: int = Field(default=3_600, ge=1)
    # Pins (core.storage.pins): the stored tokens of a conversation's pinned messages, all
    # branches together, may not go past this (a pin beyond it is refused with PinLimitError).
    max_pinned_tokens: int = Field(default=8_000, ge=0)
    # A user's memory (docs/memory.md): off, read (injected, never extracted) or on.
    memory: Literal["off", "read", "on"] = "off"
    memory_model: str | None = None  # the extraction model; unset: the summary model
    memory_max_tokens: int = Field(default=2_000, ge=0)
    memory_window_messages: int = Field(default=5, ge=1, le=100)
    memory_window_tokens: int = Field(default=12_000, ge=100)
    # Recall (core.recall): the most characters one recall returns (a page; offset reads on).
    recall_max_chars: int = Field(default=20_000, ge=100)
    # `recap serve` adds the recap_recall tool upstream and answers its calls itself, at most
    # serve_recall_max_calls rounds a turn (workers/serve/recall.py).
    serve_recall: bool = False
    serve_recall_max_calls: int = Field(default=3, ge=1, le=20)
    # Prometheus metrics: `recap serve` answers GET /metrics when serve_metrics is on (with
    # serve_metrics_key, only to `Authorization: Bearer KEY`); a worker process serves them on
    # worker_metrics_port (docs/operations.md "Metrics").
    serve_metrics: bool = False
    serve_metrics_key: SecretStr | None = None
    worker_metrics_port: int | None = Field(default=None, ge=1, le=65535)
    # OpenTelemetry traces: recap serve and the workers export their spans over OTLP/HTTP to the
    # collector OpenTelemetry's own OTEL_* variables name (docs/operations.md "Tracing").
    tracing: bool = False
    llm_timeout: float = Field(default=60, gt=0)
    max_attempts: int = Field(default=5, ge=1, le=20)
    retry_backoff_max: int = Field(default=60, ge=1)
    # RabbitMQ (an amqp:// broker): "quorum" queues (replicated, retries delayed by the broker),
    # or "classic" durable queues for servers older than 3.10 or queues declared classic before.
    amqp_queue_type: Literal["quorum", "classic"] = "quorum"
    failure_streak: int = Field(default=3, ge=1)  # failed runs in a row before a cooldown
    failure_cooldown_minutes: float = Field(default=10, gt=0)  # doubles per further failure
    summary_prompt: str = DEFAULT_SUMMARY_PROMPT
    identifier_retention_floor: float = Field(default=0.5, ge=0, le=1)
    log_json: bool = True  # workers log JSON lines; False gives readable console lines
    log_level: str = Field(default="INFO", pattern=r"(?i)^(debug|info|warning|error|critical)$")

    # `recap serve`: client keys, the upstream it calls, and its limits (README "Use it from any
    # client"). The upstream key comes only from here, never from a client.
    serve_keys: Annotated[tuple[SecretStr, ...], NoDecode] = ()
    upstream_api_base: str | None = None
    upstream_api_key: SecretStr | None = None
    # How `recap serve` calls the upstream: `direct` sends OpenAI-format requests itself (one
    # shared HTTP client), `litellm` through litellm; `auto` is direct for an `openai/` model
    # with RECAP_UPSTREAM_API_BASE set and litellm for everything else.
    upstream_client: Literal["auto", "litellm", "direct"] = "auto"
    # Which dialect the Responses and Messages routes call the upstream in: `chat` (chat
    # completions for every model), `native` (each API as itself), `auto` (natively where the
    # model names a provider that speaks the API). See workers/serve/native.py.
    upstream_dialect: Literal["chat", "auto", "native"] = "chat"
    # Whether a compression run also asks the conversation's provider to compact the span it
    # summarizes (OpenAI's `/responses/compact`, Anthropic's `compact_20260112` edit), stored
    # beside Recap's readable summary: `off`, or `auto` where the model offers it. See
    # core/compression/provider.py.
    provider_compaction: Literal["off", "auto"] = "off"
    model_map: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    # 10 MiB: a long history with a few inline images, and still a bound on memory per request.
    serve_max_body_bytes: int = Field(default=10 * 1024 * 1024, ge=1_024)
    serve_max_input_tokens: int | None = Field(default=None, ge=1)  # window for unknown models
    # Threads for database and tokenizer work: a few more than the engine pool's 5 connections.
    serve_threads: int = Field(default=8, ge=1, le=256)
    # The web console (`recap serve` under /ui, `recap ui`): the operator's keys. A UI key sees
    # every conversation; a client key of RECAP_SERVE_KEYS sees only those it created.
    ui_keys: Annotated[tuple[SecretStr, ...], NoDecode] = ()
    # Wrong console keys one client address may try in five minutes before it must wait: ten
    # lets a person mistype, and keeps guessing a 12-character key out of reach.
    ui_login_attempts: int = Field(default=10, ge=1, le=10_000)
    # Largest file or stream a command reads whole (an import, --content-file, --tools, a context
    # file): 64 MiB is twenty times the largest test-data file and a bound on a command's memory
    # (the parsed messages take several times their bytes).
    max_input_bytes: int = Field(default=64 * 1024 * 1024, ge=1)

    @field_validator("protected_tools", mode="before")
    @classmethod
    def _split_tools(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("serve_keys", "ui_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("ui_keys")
    @classmethod
    def _ui_keys_long_enough(cls, value: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        for key in value:
            if len(key.get_secret_value()) < MIN_UI_KEY_CHARS:
                raise ValueError(f"each key must be at least {MIN_UI_KEY_CHARS} characters long")
        return value

    @field_validator("model_map", mode="before")
    @classmethod
    def _parse_model_map(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        pairs: dict[str, str] = {}
        for entry in (part.strip() for part in value.split(",")):
            name, sep, model = entry.partition("=")
            if not entry:
                continue
            if not sep or not name.strip() or not model.strip():
                raise ValueError(f"expected name=litellm-model entries, got {entry!r}")
            pairs[name.strip()] = model.strip()
        return pairs

    @field_validator("summary_prompt")
    @classmethod
    def _prompt_has_placeholder(cls, value: str) -> str:
        if PREVIOUS_SUMMARY_PLACEHOLDER not in value:
            raise ValueError(f"must contain the placeholder {PREVIOUS_SUMMARY_PLACEHOLDER}")
        return value

    @field_validator("database_url")
    @classmethod
    def _url_has_scheme(cls, value: str) -> str:
        if "://" not in value:
            raise ValueError("must be an SQLAlchemy URL such as sqlite:///./recap.db")
        from recap.core.storage.db import url_problem

        problem = url_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("broker_url")
    @classmethod
    def _known_broker(cls, value: str) -> str:
        problem = broker_url_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("upstream_api_base", "summary_api_base")
    @classmethod
    def _http_base(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return value  # unset ("" from compose too): litellm's own default for the model
        problem = api_base_problem(value.strip())
        if problem is not None:
            raise ValueError(problem)
        return value.strip()

    @field_validator("result_backend", mode="before")
    @classmethod
    def _known_result_backend(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        if not value.strip():
            return None  # compose passes an unset variable as "": no results kept
        problem = result_backend_problem(value.strip())
        if problem is not None:
            raise ValueError(problem)
        return value.strip()

    @field_validator("*")
    @classmethod
    def _storable_number(cls, value: object) -> object:
        """Every number setting is finite and within what its arithmetic and the database hold
        (NaN passes any ``gt``/``ge`` bound it is compared with, and infinity passes them all)."""
        if isinstance(value, float) and not (
            math.isfinite(value) and abs(value) <= MAX_FLOAT_SETTING
        ):
            raise ValueError(f"must be a finite number no larger than {MAX_FLOAT_SETTING:g}")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT32_MAX:
            raise ValueError(f"must be at most {INT32_MAX}")
        return value

    @model_validator(mode="after")
    def _recent_bounds(self) -> Settings:
        if self.recent_min_tokens > self.recent_max_tokens:
            raise ValueError("RECAP_RECENT_MIN_TOKENS must not exceed RECAP_RECENT_MAX_TOKENS")
        return self

    @model_validator(mode="after")
    def _ui_keys_apart(self) -> Settings:
        clients = {key.get_secret_value() for key in self.serve_keys}
        if any(key.get_secret_value() in clients for key in self.ui_keys):
            raise ValueError(
                "RECAP_UI_KEYS must not repeat a key of RECAP_SERVE_KEYS: a client key would "
                "see every conversation"
            )
        return self

    @field_validator("aged_result_chars")
    @classmethod
    def _aged_room(cls, value: int) -> int:
        if 0 < value < MIN_AGED_RESULT_CHARS:
            raise ValueError(
                f"must be 0 (no aged stage) or at least {MIN_AGED_RESULT_CHARS} characters: the "
                "note naming the saved output needs room beside the head and tail"
            )
        return value

    @model_validator(mode="after")
    def _log_bounds(self) -> Settings:
        if self.log_history_days < self.log_retention_days:
            raise ValueError("RECAP_LOG_HISTORY_DAYS must be at least RECAP_LOG_RETENTION_DAYS")
        return self

    @property
    def run_seconds(self) -> int:
        """The time one ``compress_session`` run may take: Celery's soft limit, and the deadline
        the run keeps itself on pools that enforce no limit (threads, solo, the CLI)."""
        return self.task_time_limit - min(SOFT_LIMIT_MARGIN, self.task_time_limit // 5)

    @property
    def lease_seconds(self) -> int:
        """A lease outlives the hard time limit, so a live run never loses it."""
        return self.task_time_limit + LEASE_GRACE_SECONDS

    @property
    def visibility_timeout(self) -> int:
        """Redis redelivers only after the hard limit plus the longest retry delay have passed."""
        return self.task_time_limit + self.retry_backoff_max + LEASE_GRACE_SECONDS

    @property
    def ack_timeout(self) -> int:
        """Seconds a worker may hold a RabbitMQ delivery before acknowledging it (late acks):
        one hard limit waiting for a busy pool's thread, one running, and the longest retry delay
        a worker holds in memory; RabbitMQ's consumer timeout must be above it."""
        return 2 * self.task_time_limit + self.retry_backoff_max + LEASE_GRACE_SECONDS


# The least an aged result may keep: its note (how much is left out, the reference, the saved
# file's path) takes up to a few hundred characters of it.
MIN_AGED_RESULT_CHARS = 500
# A console key is typed into a login form and guards every conversation: shorter is guessable.
MIN_UI_KEY_CHARS = 12
# Largest float setting: 1e8 minutes is 190 years, and a cooldown that doubles from it still
# fits a datetime; anything larger is a typo that would overflow date arithmetic.
MAX_FLOAT_SETTING = 1e8
LEASE_GRACE_SECONDS = 30  # room for the worker to notice its time limit and let go
# Seconds between a run's own deadline (the soft limit) and the hard kill; a fifth of the limit
# when that is less, so a short limit (tests, a fast model) still leaves the run most of it.
SOFT_LIMIT_MARGIN = 10


# Broker schemes: the transports kombu 5 ships (``kombu.transport.TRANSPORT_ALIASES``, a test
# keeps this a subset of it), listed here because core never imports kombu. Recap is tested on
# filesystem, memory, redis and amqp; the rest are kombu's to make work.
BROKER_SCHEMES = frozenset(
    {
        *("filesystem", "memory", "redis", "rediss", "sentinel", "amqp", "amqps", "pyamqp"),
        *("librabbitmq", "sqs", "slmq", "sqla", "sqlalchemy", "mongodb", "zookeeper", "etcd"),
        *("consul", "qpid", "pyro", "azureservicebus", "azurestoragequeues", "gcpubsub"),
        *("confluentkafka", "kafka", "pgmq"),
    }
)


def broker_url_problem(url: str) -> str | None:
    """Why ``url`` names no broker kombu can use, or None when it does. Celery takes several
    URLs separated by ``;`` (failover): each is checked."""
    example = "expected for example filesystem://, redis://host:6379/0 or amqp://user@host//"
    for part in (piece.strip() for piece in url.split(";")):
        scheme, separator, _ = part.partition("://")
        if not separator or not scheme:
            return f"not a broker URL (no scheme://); {example}"  # the value may hold a password
        transport = scheme.split("+", 1)[0].lower()  # redis+socket://, sqla+postgresql://
        if transport not in BROKER_SCHEMES:
            return f"no broker transport is called {scheme!r}; {example}"
    return None


# Result backends: the names Celery 5 resolves a result backend URL's scheme by
# (``celery.app.backends.BACKEND_ALIASES``, a test keeps this a subset of it; the part before a
# ``+`` names it: ``db+postgresql://``, ``cache+memcached://``). Recap is tested on redis.
RESULT_BACKENDS = frozenset(
    {
        *("redis", "rediss", "sentinel", "rpc", "db", "database", "cache", "mongodb", "file"),
        *("elasticsearch", "cassandra", "couchbase", "couchdb", "cosmosdbsql", "riak"),
        *("disabled", "consul", "dynamodb", "azureblockblob", "arangodb", "s3", "gs"),
    }
)
# A result backend class of one's own, as Celery takes it: ``package.module:ClassName``.
BACKEND_CLASS = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+:[A-Za-z_]\w*")


def result_backend_problem(value: str) -> str | None:
    """Why ``value`` names no result backend Celery can use, or None when it does: a URL whose
    scheme (before any ``+``) is one of Celery's backends, or a backend class's import path.
    The reason never repeats the value (it may hold a password)."""
    example = "expected for example redis://host:6379/1, rpc:// or db+postgresql://user@host/db"
    scheme, separator, _ = value.partition("://")
    if not separator:
        if BACKEND_CLASS.fullmatch(value):
            return None
        return f"not a result backend URL (no scheme://); {example}"
    if not scheme:
        return f"not a result backend URL (no scheme before ://); {example}"
    backend = scheme.split("+", 1)[0]  # Celery reads the name as written: REDIS:// is no backend
    if backend not in RESULT_BACKENDS:
        return f"no result backend is called {backend!r}; {example}"
    return None


def api_base_problem(value: str) -> str | None:
    """Why ``value`` is no base URL a model can be called at (``http://`` or ``https://`` and
    a host), or None when it is one; the reason never repeats the value (it may hold a
    password)."""
    example = "expected for example http://127.0.0.1:8000/v1 or https://api.openai.com/v1"
    scheme, separator, rest = value.partition("://")
    if not separator or scheme.lower() not in ("http", "https"):
        return f"must be an http:// or https:// URL; {example}"
    host = rest.split("/", 1)[0].rpartition("@")[2]
    if not host or host.startswith(":") or any(c.isspace() for c in value):
        return f"must name a host (and no spaces); {example}"
    return None


def load_settings(**overrides: object) -> Settings:
    """Read the settings, turning a validation failure into one readable ``SettingsError``."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = ".".join(str(part) for part in error["loc"]) or "settings"
            name = f"RECAP_{field.upper()}" if error["loc"] else field
            problems.append(f"{name}: {error['msg'].removeprefix('Value error, ')}")
        raise SettingsError("invalid settings: " + "; ".join(problems)) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return load_settings()
