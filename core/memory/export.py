"""Everything kept about one user, as one JSON object: their switch, their entries (with the
conversation and message that last wrote each) and the turns whose extraction wrote to them."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from recap.core.storage import memories


def export_user(engine: Engine, user_id: str) -> dict[str, Any]:
    """``recap memory export USER``: the user's memory as stored."""
    entries = memories.list_memories(engine, user_id)
    runs = memories.written_by(engine, user_id)
    return {
        "user_id": user_id,
        "enabled": memories.is_enabled(engine, user_id),
        "tokens": sum(m.tokens for m in entries),
        "memories": [m.as_dict() for m in entries],
        "extractions": [
            {**run, "created_at": run["created_at"].isoformat() if run["created_at"] else None}
            for run in runs
        ],
    }
