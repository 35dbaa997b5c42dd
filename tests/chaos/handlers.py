"""The soak's in-database effects: one row per job key in `chaos_effects`, its `runs` counting
how many times the effect committed. Exactly once means `runs = 1` for every succeeded key."""

from __future__ import annotations

from typing import Any

# The SQL handler's statement (configured, never from the API): the same upsert, one row per
# page; a page of 1 row is below the page size of 2, so the job completes with that page.
SQL_EFFECT = (
    "INSERT INTO chaos_effects (key, runs) SELECT $1::text, 1 WHERE $2::int > 0 "
    "ON CONFLICT (key) DO UPDATE SET runs = chaos_effects.runs + 1"
)

CREATE_TABLE = "CREATE TABLE IF NOT EXISTS chaos_effects (key text PRIMARY KEY, runs int NOT NULL)"


async def record_effect(job: Any, ctx: Any) -> dict[str, Any]:
    """Transactional: the upsert commits with the job's completion, or not at all."""
    await ctx.connection.execute(
        "INSERT INTO chaos_effects (key, runs) VALUES ($1, 1) "
        "ON CONFLICT (key) DO UPDATE SET runs = chaos_effects.runs + 1",
        job.key,
    )
    return {"recorded": job.key}
