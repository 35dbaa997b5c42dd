"""Leases under pressure (invariant 8): the heartbeat never waits on a handler's row lock,
everything in memory is keyed by (job id, attempt), and transactional handlers cannot starve
intake, the heartbeat or the completer of connections, nor spend their timeout waiting."""

from __future__ import annotations

from typing import Any

import aiohttp
import asyncpg

from tests.harness import make_settings, running_daemon, until_job_keys, wait_until
from tests.service import lease_handlers

HANDLERS = f"{lease_handlers.__name__}"


async def jobs_by_key(db_url: str) -> dict[str, asyncpg.Record]:
    conn = await asyncpg.connect(db_url)
    try:
        rows = await conn.fetch(
            "SELECT key, state, attempt, dead_reason, last_error FROM dispatcher.jobs"
        )
    finally:
        await conn.close()
    return {r["key"]: r for r in rows}


SETTLED = ("succeeded", "dead")


def handler(function: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "python", "function": f"{HANDLERS}:{function}", **extra}


async def test_heartbeat_does_not_wait_on_a_transactional_handlers_row_lock(db_url: str) -> None:
    """A transactional handler holds its job's row lock for its whole run (6 s, twice the
    lease): every other lease of the process must still be renewed."""
    settings = make_settings(
        db_url,
        lease_s=3,
        handlers={
            "locked": handler("sleeper", transactional=True, timeout_s=30),
            "plain": handler("sleeper", transactional=False, timeout_s=30),
        },
    )
    async with running_daemon(settings) as d:
        await d.post_job("holds-lock", {"handler": "locked", "payload": {"sleep_s": 6}})
        await d.post_job("plain", {"handler": "plain", "payload": {"sleep_s": 6}})
        await until_job_keys(db_url, dict.fromkeys(["holds-lock", "plain"], SETTLED), timeout_s=30)
    jobs = await jobs_by_key(db_url)
    for key in ("holds-lock", "plain"):
        assert (jobs[key]["state"], jobs[key]["attempt"]) == ("succeeded", 1), dict(jobs[key])
    assert lease_handlers.STARTED.count(("plain", 1)) == 1
    assert ("plain", 2) not in lease_handlers.STARTED


async def test_a_stale_attempt_ending_leaves_the_new_attempt_alone(db_url: str) -> None:
    """Attempt 1 loses its lease; this same process claims attempt 2; attempt 1 then finishes.
    Attempt 2 must keep its heartbeat (it runs twice the lease) and succeed: a job that never
    failed never ends dead."""
    lease_handlers.DSN = db_url
    settings = make_settings(
        db_url, lease_s=1.5, handlers={"lose": handler("loses_its_lease", transactional=False)}
    )
    async with running_daemon(settings) as d:
        payload = {"then": "finish", "second_s": 3}
        await d.post_job("stale-finish", {"handler": "lose", "payload": payload})
        await until_job_keys(db_url, dict.fromkeys(["stale-finish"], SETTLED), timeout_s=30)
    job = (await jobs_by_key(db_url))["stale-finish"]
    assert (job["state"], job["attempt"]) == ("succeeded", 2), dict(job)
    assert ("stale-finish", 1) in lease_handlers.FINISHED  # the stale attempt did finish first


async def test_a_stale_attempts_timeout_cancels_only_itself(db_url: str) -> None:
    """Attempt 1 loses its lease after 1 s and hangs; its 3 s timeout fires while attempt 2
    (claimed at about 1.2 s, working 2.5 s) runs: only attempt 1 may be cancelled."""
    lease_handlers.DSN = db_url
    settings = make_settings(
        db_url,
        lease_s=1.5,
        handlers={"lose": handler("loses_its_lease", transactional=False, timeout_s=3)},
    )
    async with running_daemon(settings) as d:
        payload = {"then": "hang", "hold_s": 1, "second_s": 2.5}
        await d.post_job("stale-timeout", {"handler": "lose", "payload": payload})
        await until_job_keys(db_url, dict.fromkeys(["stale-timeout"], SETTLED), timeout_s=30)
    job = (await jobs_by_key(db_url))["stale-timeout"]
    assert (job["state"], job["attempt"]) == ("succeeded", 2), dict(job)
    assert ("stale-timeout", 2) in lease_handlers.FINISHED


async def test_slow_transactional_handlers_starve_nothing(db_url: str) -> None:
    """Six transactional handlers hold their connections (two at a time can) for 3 s each with
    a 4 s timeout: the last ones wait about 6 s for a connection. Meanwhile intake answers,
    /readyz is ready, and afterwards every job succeeded on its first attempt (the timeout
    counts from when a handler has its connection)."""
    lease_handlers.GATE.clear()
    settings = make_settings(
        db_url,
        db_pool_size=2,
        handler_pool_size=2,
        lease_s=2,
        handlers={"gated": handler("gated", transactional=True, timeout_s=4)},
    )
    keys = [f"slow-{i}" for i in range(6)]
    async with running_daemon(settings) as d:
        for key in keys:
            await d.post_job(key, {"handler": "gated", "payload": {"work_s": 3}})

        def count(runs: list[tuple[str, int]]) -> int:
            return sum(k.startswith("slow-") for k, _ in runs)

        await wait_until(
            lambda: count(lease_handlers.STARTED) == 2, what="two handlers holding connections"
        )
        # both handler connections are taken and held: the API's own pool still serves
        timeout = aiohttp.ClientTimeout(total=10)
        async with d.session.post(
            f"{d.base_url}/v1/jobs",
            json={"handler": "gated", "payload": {"work_s": 0}},
            headers={"Idempotency-Key": "while-busy"},
            timeout=timeout,
        ) as r:
            assert r.status == 202, await r.text()
        async with d.session.get(f"{d.base_url}/readyz", timeout=timeout) as r:
            assert r.status == 200, await r.text()
        assert (count(lease_handlers.STARTED), count(lease_handlers.FINISHED)) == (2, 0)
        lease_handlers.GATE.set()
        await until_job_keys(db_url, dict.fromkeys([*keys, "while-busy"], SETTLED), timeout_s=60)
    jobs = await jobs_by_key(db_url)
    for key in [*keys, "while-busy"]:
        assert (jobs[key]["state"], jobs[key]["attempt"]) == ("succeeded", 1), dict(jobs[key])
