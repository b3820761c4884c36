"""The host API's opt-in metrics: after ``recap.enable_metrics(registry)``, each real
``Recap.assemble`` (SQLite) records its time, and a truncated one its left-out tokens as the
request itself reports them; before it, nothing is recorded."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

import recap
from recap.core.settings import Settings


def history(turns: int) -> list[dict[str, str]]:
    messages = []
    for n in range(turns):
        words = " ".join(f"t{n}w{i}" for i in range(60))
        messages += [{"role": "user", "content": f"q{n} {words}"},
                     {"role": "assistant", "content": f"a{n} {words}"}]  # fmt: skip
    return messages


def test_assemble_time_and_truncations_are_recorded(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'recap.db'}")
    host = recap.Recap(settings, create_schema=True)
    host.new("short", max_input_tokens=8_000)
    host.new("long", max_input_tokens=2_000)
    host.add_many("short", history(1))
    host.add_many("long", history(60))
    registry = CollectorRegistry()
    host.assemble("short")  # before enabling: not recorded
    recap.enable_metrics(registry)
    try:
        first = host.assemble("short")
        long = host.assemble("long")
        assert not first.truncated
        assert long.truncated and long.truncated_tokens > 0
        count = registry.get_sample_value("recap_assemble_seconds_count")
        total = registry.get_sample_value("recap_assemble_seconds_sum")
        assert count == 2
        assert total is not None and 0 < total < 30
        assert registry.get_sample_value("recap_assemble_truncated_total") == 1
        left_out = registry.get_sample_value("recap_assemble_left_out_tokens_total")
        assert left_out == long.truncated_tokens
    finally:
        from recap.core import metrics

        metrics._enabled.clear()
        host.engine.dispose()
