"""Python handlers used by the end-to-end tests (loaded by the daemon as `module:function`)."""

from __future__ import annotations

from typing import Any


async def record_effect(job: Any, ctx: Any) -> dict[str, Any]:
    """An in-database business effect: one row per execution, committed with the completion."""
    await ctx.connection.execute(
        "INSERT INTO app_effects (job_key, payload) VALUES ($1, $2::jsonb)", job.key, job.payload
    )
    return {"recorded": job.key}


async def fail_always(job: Any, ctx: Any) -> None:
    """Fails every attempt: a job that is retried until its attempts run out (test_history)."""
    raise RuntimeError(f"{job.key} fails on purpose")
