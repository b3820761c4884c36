"""The request value: its fields checked once where it is made, and every door that assembles
taking it (the keyword arguments build the same value; the value and a part besides it refuse)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import recap as recap_api
from recap.core.aio import AsyncRecap
from recap.core.client import Recap
from recap.core.errors import InputError
from recap.core.settings import Settings
from recap.core.values.request import ContextFile, RequestSpec, request_from

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


@pytest.fixture
def recap(tmp_path: Path) -> Recap:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'r.db'}", output_dir=tmp_path / "outputs"
    )
    return Recap(settings, create_schema=True)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_input_tokens": 0}, "--max-input-tokens must be positive, got 0"),
        ({"max_input_tokens": -5}, "--max-input-tokens must be positive, got -5"),
    ],
)
def test_a_bad_field_is_refused_where_the_value_is_made(
    fields: dict[str, Any], message: str
) -> None:
    """The message is the one assemble gave for the same input."""
    with pytest.raises(InputError, match=message):
        RequestSpec(**fields)


@pytest.mark.parametrize(
    ("given", "field", "kept"),
    [
        ({"tools": TOOLS}, "tools", tuple(TOOLS)),
        ({"tools": []}, "tools", ()),
        ({"context_files": [ContextFile("a", "x")]}, "context_files", (ContextFile("a", "x"),)),
        ({"as_of": datetime(2026, 1, 2, 3, 4)}, "as_of", datetime(2026, 1, 2, 3, 4, tzinfo=UTC)),
        (
            {"as_of": datetime(2026, 1, 2, 5, 4, tzinfo=timezone(timedelta(hours=2)))},
            "as_of",
            datetime(2026, 1, 2, 3, 4, tzinfo=UTC),
        ),
    ],
)
def test_the_value_keeps_its_fields_frozen_and_in_utc(
    given: dict[str, Any], field: str, kept: object
) -> None:
    """Sequences become tuples, a moment is kept in UTC (a naive one taken as UTC)."""
    assert getattr(RequestSpec(**given), field) == kept


@pytest.mark.parametrize(
    ("request_value", "parts", "expected"),
    [
        (None, {"system": "s"}, RequestSpec(system="s")),
        (RequestSpec(system="s"), {}, RequestSpec(system="s")),
        (
            RequestSpec(system="s"),
            {"text_only": False, "context_files": ()},
            RequestSpec(system="s"),
        ),
        (RequestSpec(system="s"), {"reminder": "r"}, None),
        (RequestSpec(), {"max_input_tokens": 100}, None),
    ],
)
def test_the_parts_build_the_value_and_never_sit_beside_it(
    request_value: RequestSpec | None, parts: dict[str, Any], expected: RequestSpec | None
) -> None:
    """A part left at its default adds nothing; one that differs beside a value is refused."""
    if expected is None:
        with pytest.raises(InputError, match="not both"):
            request_from(request_value, **parts)
    else:
        assert request_from(request_value, **parts) == expected


def test_recap_assemble_takes_the_value_or_its_keyword_arguments(recap: Recap) -> None:
    """The same request either way, through Recap and AsyncRecap; both at once is refused."""
    cid = recap.new(max_input_tokens=8_000)
    recap.add(cid, {"role": "user", "content": "hello there"})
    spec = recap_api.RequestSpec(system="Be brief.", tools=TOOLS, reminder="Stay on task.")
    by_keywords = recap.assemble(cid, system="Be brief.", tools=TOOLS, reminder="Stay on task.")
    by_value = recap.assemble(cid, request=spec)
    assert by_value.as_dict() == by_keywords.as_dict()
    with pytest.raises(InputError, match="not both"):
        recap.assemble(cid, request=spec, system="Other.")

    async def both() -> tuple[Any, Any]:
        async with AsyncRecap(recap) as aio:
            return await aio.assemble(cid, request=spec), await aio.assemble(cid, leaf=None)

    async_value, async_plain = asyncio.run(both())
    assert async_value.as_dict() == by_value.as_dict()
    assert async_plain.messages[-1] == {"role": "user", "content": "hello there"}
