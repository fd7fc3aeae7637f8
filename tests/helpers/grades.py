"""The feedback a store holds, as tests compare it."""

from __future__ import annotations

from sqlalchemy import text

from openclaw.store import Store


async def grades(store: Store) -> list[tuple[str, str, str, str]]:
    """(grader, the graded turn's text, kind, source) of every grade, oldest first."""
    async with store.engine.connect() as conn:
        rows = await conn.execute(text(
            "SELECT f.user_key, i.text, f.kind, f.source FROM feedback f "
            "JOIN inbound_events i ON i.id = f.inbound_event_id ORDER BY f.id"))
        return [tuple(row) for row in rows]
