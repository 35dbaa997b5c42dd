"""Snooze through a real daemon, on both transports: a Python handler that returns or raises
`Snooze` runs again after the delay (or at the time) it asked for, without spending an attempt;
a transactional handler's writes of a snoozed run roll back; a job that snoozes past its retry
age or more than its queue's `max_snoozes` ends dead with that reason, never runs forever.

The handlers below count their runs per job key in this process (the daemon runs in it)."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from dispatcher.errors import RetryLater, Snooze
from tests.harness import make_settings, running_daemon, wait_until

RUNS: Counter[str] = Counter()
# per key, the earliest each snooze lets the next run start, by this process's clock: the
# handler's own now + DELAY_S (the daemon takes its now after the handler returned) or `until`
NOT_BEFORE: dict[str, list[datetime]] = {}
DELAY_S = 0.3


async def snooze_then_succeed(job: Any, ctx: Any) -> Any:
    """Run 1 returns a snooze of DELAY_S, run 2 raises one until now + DELAY_S, run 3 ends."""
    RUNS[job.key] += 1
    if job.payload.get("wait"):
        await asyncio.sleep(0)  # not finished inline: the attempt goes on in a task
    not_before = datetime.now(UTC) + timedelta(seconds=DELAY_S)
    if RUNS[job.key] <= 2:
        NOT_BEFORE.setdefault(job.key, []).append(not_before)
    if RUNS[job.key] == 1:
        return Snooze(DELAY_S, reason="nothing yet")
    if RUNS[job.key] == 2:
        raise Snooze(until=not_before)
    return {"runs": RUNS[job.key]}


async def write_then_snooze(job: Any, ctx: Any) -> Any:
    """A transactional handler: writes a row on every run; returns a snooze on the first,
    raises one on the second."""
    RUNS[job.key] += 1
    await ctx.connection.execute("INSERT INTO app_writes (job_key) VALUES ($1)", job.key)
    if RUNS[job.key] == 1:
        return Snooze(0.05)
    if RUNS[job.key] == 2:
        ctx.snooze(0.05)
    return {"runs": RUNS[job.key]}


async def snooze_forever(job: Any, ctx: Any) -> Any:
    RUNS[job.key] += 1
    return Snooze(job.payload["delay_s"])


async def snooze_then_fail(job: Any, ctx: Any) -> Any:
    """Snoozes once, then fails: the failure spends attempt 1, the next run is attempt 2."""
    RUNS[job.key] += 1
    if RUNS[job.key] == 1:
        raise Snooze(0)
    if RUNS[job.key] == 2:
        raise RetryLater("not yet", 0)
    return {"attempt": job.attempt}


def handler(function: Any, transactional: bool = False) -> dict[str, Any]:
    return {
        "kind": "python",
        "transactional": transactional,
        "function": f"{__name__}:{function.__name__}",
    }


HANDLERS = {
    "snoozer": handler(snooze_then_succeed),
    "writer": handler(write_then_snooze, transactional=True),
    "forever": handler(snooze_forever),
    "then_fail": handler(snooze_then_fail),
}


async def ended(conn: asyncpg.Connection, keys: list[str]) -> dict[str, asyncpg.Record]:
    found: dict[str, asyncpg.Record] = {}

    async def all_ended() -> bool:
        rows = await conn.fetch(
            "SELECT key, id, state, attempt, dead_reason, last_error FROM dispatcher.jobs"
            " WHERE key = ANY ($1::text[]) AND state IN ('succeeded', 'dead')",
            keys,
        )
        found.update({r["key"]: r for r in rows})
        return len(found) == len(keys)

    await wait_until(all_ended, timeout_s=30, what=f"jobs {keys} ended")
    return found


async def history(conn: asyncpg.Connection, job_id: int) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT attempt, outcome, reason, excerpt, started_at, finished_at"
        "  FROM dispatcher.attempt_history"
        " WHERE job_id = $1 ORDER BY id",
        job_id,
    )


async def test_a_snooze_runs_again_later_without_spending_an_attempt(
    db_url: str, transport: dict[str, Any]
) -> None:
    RUNS.clear()
    NOT_BEFORE.clear()
    keys = {"inline": {}, "in-a-task": {"wait": True}}
    settings = make_settings(db_url, handlers=HANDLERS, **transport)
    conn = await asyncpg.connect(db_url)
    try:
        async with running_daemon(settings) as d:
            for key, payload in keys.items():
                await d.post_job(key, {"handler": "snoozer", "payload": payload})
            jobs = await ended(conn, list(keys))
            histories = {key: await history(conn, jobs[key]["id"]) for key in keys}
    finally:
        await conn.close()
    for key in keys:
        job, runs = jobs[key], histories[key]
        assert (job["state"], job["attempt"], RUNS[key]) == ("succeeded", 1, 3), key
        assert [(r["attempt"], r["outcome"], r["reason"], r["excerpt"]) for r in runs] == [
            (1, "snoozed", "snoozed", "nothing yet"),
            (1, "snoozed", "snoozed", "snoozed"),
            (1, "succeeded", None, None),
        ], key
        for (before, after), not_before in zip(
            itertools.pairwise(runs), NOT_BEFORE[key], strict=True
        ):
            # the next run starts no sooner than asked: measured from when the snooze was
            # asked (this process's clock, the same machine's as the database's), not from the
            # attempt's recorded end, which a busy completion writer may set later than that
            early_s = (not_before - after["started_at"]).total_seconds()
            assert early_s <= 0.05, (key, early_s)
            waited = (after["started_at"] - before["finished_at"]).total_seconds()
            assert waited < DELAY_S + 5, (key, waited)


async def test_a_snoozed_transactional_run_commits_none_of_its_writes(
    db_url: str, transport: dict[str, Any]
) -> None:
    RUNS.clear()
    settings = make_settings(db_url, handlers=HANDLERS, **transport)
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute("CREATE TABLE app_writes (job_key text NOT NULL)")
        async with running_daemon(settings) as d:
            await d.post_job("tx", {"handler": "writer", "payload": {}})
            job = (await ended(conn, ["tx"]))["tx"]
        writes = await conn.fetchval("SELECT count(*) FROM app_writes WHERE job_key = 'tx'")
        outcomes = [r["outcome"] for r in await history(conn, job["id"])]
    finally:
        await conn.close()
    assert (job["state"], job["attempt"], RUNS["tx"]) == ("succeeded", 1, 3)
    assert outcomes == ["snoozed", "snoozed", "succeeded"]
    assert writes == 1  # the two snoozed runs rolled back


async def test_snoozes_are_bounded_by_the_cap_and_the_retry_age(
    db_url: str, transport: dict[str, Any]
) -> None:
    RUNS.clear()
    queue = {"max_snoozes": 3, "max_retry_age_s": 3600}
    settings = make_settings(db_url, handlers=HANDLERS, queues={"default": queue}, **transport)
    conn = await asyncpg.connect(db_url)
    try:
        async with running_daemon(settings) as d:
            await d.post_job("often", {"handler": "forever", "payload": {"delay_s": 0}})
            await d.post_job("far", {"handler": "forever", "payload": {"delay_s": 7200}})
            await d.post_job("endless", {"handler": "forever", "payload": {"delay_s": 1e308}})
            await d.post_job("fails", {"handler": "then_fail", "payload": {}})
            jobs = await ended(conn, ["often", "far", "endless", "fails"])
            often = await history(conn, jobs["often"]["id"])
    finally:
        await conn.close()
    assert (jobs["often"]["state"], jobs["often"]["dead_reason"]) == ("dead", "max_snoozes")
    assert RUNS["often"] == 4  # three snoozes, and the fourth asked for one too many
    assert [r["outcome"] for r in often] == ["snoozed"] * 3 + ["dead"]
    assert {r["attempt"] for r in often} == {1}
    for key in ("far", "endless"):  # past the one-hour retry age: dead at the first snooze
        job = jobs[key]
        assert (job["state"], job["dead_reason"], RUNS[key]) == (
            "dead",
            "snoozed_past_retry_age",
            1,
        ), key
    # a failure after a snooze spends attempt 1; the run after it is attempt 2
    assert (jobs["fails"]["state"], jobs["fails"]["attempt"], RUNS["fails"]) == (
        "succeeded",
        2,
        3,
    )


def test_a_snooze_asks_for_one_clear_time() -> None:
    with pytest.raises(ValueError, match=r"delay_s .* or until"):
        Snooze()
    with pytest.raises(ValueError, match=r"delay_s .* or until"):
        Snooze(5, until=datetime.now(UTC))
    with pytest.raises(ValueError, match="UTC offset"):
        Snooze(until=datetime(2030, 1, 1))
    with pytest.raises(ValueError, match="number of seconds"):
        Snooze(float("nan"))
    with pytest.raises(ValueError, match="number of seconds"):
        Snooze("5")  # type: ignore[arg-type]
