"""Settings: contract defaults, and one clear error for each kind of invalid value."""

from __future__ import annotations

import pytest

from recap.core.settings import SettingsError, load_settings


def test_contract_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every default named in the contract holds when nothing is set."""
    for name in ("RECAP_OUTPUT_DIR", "RECAP_BROKER_FOLDER"):
        monkeypatch.delenv(name, raising=False)
    s = load_settings()
    assert s.database_url == "sqlite:///./recap.db"
    assert s.broker_url.startswith("filesystem://")
    assert s.result_backend is None
    assert s.default_model == "gpt-4o-mini"
    assert s.summary_model is None
    assert s.summary_api_base is None and s.summary_api_key is None
    assert str(s.output_dir) == ".recap/outputs"
    assert s.trigger_ratio == 0.75
    assert s.idle_minutes == 60
    assert s.output_retention_days == 7
    assert s.task_time_limit == 300
    assert s.reconcile_seconds == 300


def test_lease_and_visibility_derive_from_time_limit() -> None:
    """The lease outlives the hard limit; the visibility timeout outlives limit plus backoff."""
    s = load_settings(task_time_limit=40, retry_backoff_max=10)
    assert s.lease_seconds > 40
    assert s.visibility_timeout > 40 + 10


@pytest.mark.parametrize(
    ("limit", "run"),
    [(300, 290), (50, 40), (49, 40), (20, 16), (5, 4)],
)
def test_a_run_ends_before_its_hard_limit_and_its_lease(limit: int, run: int) -> None:
    """A run's own deadline is 10 s before the hard limit, or a fifth of it when that is less."""
    s = load_settings(task_time_limit=limit)
    assert s.run_seconds == run
    assert s.run_seconds < s.task_time_limit < s.lease_seconds


def test_env_and_list_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Environment values are read with the RECAP_ prefix; tool lists are comma-separated."""
    monkeypatch.setenv("RECAP_TRIGGER_RATIO", "0.6")
    monkeypatch.setenv("RECAP_PROTECTED_TOOLS", "todo_write, plan ,")
    s = load_settings()
    assert s.trigger_ratio == 0.6
    assert s.protected_tools == ("todo_write", "plan")


def test_dotenv_is_read(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """A .env file in the working directory supplies settings."""
    (tmp_path / ".env").write_text("RECAP_DEFAULT_MODEL=gpt-4.1\n")
    assert load_settings().default_model == "gpt-4.1"


@pytest.mark.parametrize(
    ("variable", "value", "fragment"),
    [
        ("RECAP_TRIGGER_RATIO", "1.5", "RECAP_TRIGGER_RATIO"),
        ("RECAP_TRIGGER_RATIO", "lots", "RECAP_TRIGGER_RATIO"),
        ("RECAP_IDLE_MINUTES", "-1", "RECAP_IDLE_MINUTES"),
        ("RECAP_TASK_TIME_LIMIT", "0", "RECAP_TASK_TIME_LIMIT"),
        ("RECAP_SAFETY_MARGIN", "0.9", "RECAP_SAFETY_MARGIN"),
        ("RECAP_MAX_ATTEMPTS", "0", "RECAP_MAX_ATTEMPTS"),
        ("RECAP_DATABASE_URL", "recap.db", "RECAP_DATABASE_URL"),
        ("RECAP_SUMMARY_PROMPT", "Summarize this.", "{previous_summary}"),
        ("RECAP_RECENT_MIN_TOKENS", "9000", "RECAP_RECENT_MIN_TOKENS"),
        ("RECAP_FAILURE_STREAK", "0", "RECAP_FAILURE_STREAK"),
        ("RECAP_FAILURE_COOLDOWN_MINUTES", "0", "RECAP_FAILURE_COOLDOWN_MINUTES"),
        ("RECAP_LLM_TIMEOUT", "-5", "RECAP_LLM_TIMEOUT"),
    ],
)
def test_invalid_values_give_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, fragment: str
) -> None:
    """An invalid value is one SettingsError naming the variable."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message
