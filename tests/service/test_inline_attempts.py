"""Attempts of non-transactional python handlers start inline, in the claim loop's frame: those
that finish without waiting share one task and one completion write, the others go on in a task
of their own, in the context they started in (engine/queue_worker.py, engine/executor.py). In
process, real database: a claim of one batch mixes every way an attempt can end."""

from __future__ import annotations

import asyncio
import json
from contextvars import ContextVar
from typing import Any

import asyncpg

from dispatcher.client import enqueue
from dispatcher.errors import RetryLater
from tests.harness import make_settings, running_daemon, wait_until

SEEN: dict[str, list[int]] = {}
MARK: ContextVar[str | None] = ContextVar("inline_attempts_mark", default=None)


async def at_once(job: Any, ctx: Any) -> dict[str, Any]:
    """Ends without waiting: succeeds, or on its first attempt fails as `mode` says."""
    SEEN.setdefault(job.key, []).append(job.attempt)
    mode = job.payload["mode"]
    if job.attempt == 1 and mode == "retry":
        raise RetryLater("again", delay_s=0)
    if job.attempt == 1 and mode == "error":
        raise ValueError("boom")
    if mode == "reject":
        ctx.reject("payload says no")
    return {"attempt": job.attempt, "leaked": MARK.get()}


async def waits_midway(job: Any, ctx: Any) -> dict[str, Any]:
    """Marks its context, waits, and reports whether the mark was still there: the task that
    goes on with it must run in the context its first step ran in."""
    SEEN.setdefault(job.key, []).append(job.attempt)
    leaked = MARK.get()
    MARK.set(job.key)
    await asyncio.sleep(0.01)
    return {"leaked": leaked, "kept": MARK.get() == job.key}


async def test_a_claim_of_mixed_attempts_each_ends_once_as_its_handler_said(db_url: str) -> None:
    untransactional = {"kind": "python", "transactional": False}
    settings = make_settings(
        db_url,
        handlers={
            "now": {**untransactional, "function": f"{__name__}:at_once"},
            "later": {**untransactional, "function": f"{__name__}:waits_midway"},
        },
        queues={"default": {"backoff_base_s": 0.05, "backoff_cap_s": 0.1, "claim_batch": 100}},
    )
    modes = ("ok", "retry", "error", "reject")
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(
            "INSERT INTO dispatcher.handlers (name, kind) VALUES ('now', 'python'),"
            " ('later', 'python') ON CONFLICT DO NOTHING"
        )
        # queued before the daemon starts: its first claim takes them all together
        for i in range(40):
            mode = modes[i % 4]
            await enqueue(conn, f"{mode}-{i}", "now", {"mode": mode})
            if i % 4 == 0:
                await enqueue(conn, f"later-{i}", "later", {})
        async with running_daemon(settings):

            async def all_ended() -> bool:
                waiting = await conn.fetchval(
                    "SELECT count(*) FROM dispatcher.jobs WHERE state NOT IN ('succeeded', 'dead')"
                )
                return bool(waiting == 0)

            await wait_until(all_ended, timeout_s=20, what="every job ended")
        rows = await conn.fetch(
            "SELECT key, state, attempt, result, dead_reason,"
            "       (SELECT array_agg(a.outcome ORDER BY a.attempt)"
            "          FROM dispatcher.attempt_history a"
            "         WHERE a.job_id = j.id) AS history"
            "  FROM dispatcher.jobs j"
        )
    finally:
        await conn.close()
    jobs = {r["key"]: r for r in rows}
    assert len(jobs) == 50
    for key, job in jobs.items():
        mode = key.split("-")[0]
        if mode == "reject":
            assert (job["state"], job["dead_reason"]) == ("dead", "rejected_by_handler")
            assert job["history"] == ["dead"] and SEEN[key] == [1]
        elif mode in ("retry", "error"):
            assert (job["state"], job["attempt"]) == ("succeeded", 2), key
            assert job["history"] == ["retried", "succeeded"] and SEEN[key] == [1, 2]
        else:
            assert (job["state"], job["attempt"]) == ("succeeded", 1), key
            assert job["history"] == ["succeeded"] and SEEN[key] == [1]
        result = json.loads(job["result"]) if job["result"] is not None else None
        if mode == "later":
            # nothing of another attempt's context was seen, and its own survived the wait
            assert result == {"leaked": None, "kept": True}
        elif mode != "reject":
            assert result["leaked"] is None
