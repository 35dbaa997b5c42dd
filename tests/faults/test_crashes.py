"""SIGKILL in the crash windows the e2e suite does not cover: right after the claim, between the
pages of a SQL handler, and in the middle of a burst (invariants 1 and 2)."""

from __future__ import annotations

import contextlib
import json
import signal

import aiohttp

from tests.faults.common import (
    create_effects_table,
    daemon_env,
    effects_per_key,
    fetch,
    fetchval,
    post_batch,
    states,
)
from tests.harness import Target, serve_target, until_job_states, wait_until
from tests.harness.fixtures import Spawn


async def test_sigkill_after_claim_rescues_and_runs_each_effect_once(
    db_url: str, spawn: Spawn
) -> None:
    await create_effects_table(db_url)
    target = Target()
    async with serve_target(target):
        env = daemon_env(db_url)
        crashing = await spawn({**env, "DISPATCHER_FAULT": "after_claim"})
        jobs = [{"idempotency_key": f"claimed-py-{i}", "handler": "record"} for i in range(5)]
        jobs += [
            {
                "idempotency_key": f"claimed-http-{i}",
                "handler": "http",
                "target": {"url": target.url},
            }
            for i in range(5)
        ]
        # the claim can now follow the batch's commit before its answer is written, and the
        # fault kills the daemon there: the answer may be lost, the jobs are not (all ten must
        # succeed below)
        with contextlib.suppress(aiohttp.ServerDisconnectedError):
            await post_batch(crashing.base_url, jobs)
        assert await crashing.wait() == -signal.SIGKILL
        # killed holding leases, before any effect started
        held = await fetch(
            db_url, "SELECT key, lease_expires_at FROM dispatcher.jobs WHERE state = 'running'"
        )
        assert held, await states(db_url)
        assert await fetchval(db_url, "SELECT count(*) FROM fault_effects") == 0
        assert target.requests == []
        expiry = {r["key"]: r["lease_expires_at"] for r in held}

        restarted = await spawn(env)
        await until_job_states(db_url, {"succeeded": 10}, timeout_s=30)
        assert await restarted.stop() == 0

    rows = await fetch(db_url, "SELECT key, attempt, started_at FROM dispatcher.jobs")
    # how each first attempt ended: its lease expired, or its owner was seen gone (its liveness
    # lock free: docs/recovery.md), which may come before the lease's expiry
    rescued = {
        r["key"]: r["reason"]
        for r in await fetch(
            db_url,
            "SELECT j.key, a.reason FROM dispatcher.attempt_history a"
            " JOIN dispatcher.jobs j ON j.id = a.job_id WHERE a.attempt = 1",
        )
    }
    for row in rows:
        if row["key"] in expiry:
            # no second attempt before the lease expired, unless the owner was known gone
            if rescued[row["key"]] != "owner_gone":
                assert row["started_at"] >= expiry[row["key"]], row
            assert row["attempt"] == 2, row
        else:
            assert row["attempt"] == 1, row
    effects = await effects_per_key(db_url)
    assert effects == {f"claimed-py-{i}": 1 for i in range(5)}
    assert sorted(r["key"] for r in target.requests) == sorted(
        f"claimed-http-{i}" for i in range(5)
    )


PURGE_HANDLER = {
    "DISPATCHER_HANDLERS__PURGE__KIND": "sql",
    "DISPATCHER_HANDLERS__PURGE__STATEMENT": (
        "DELETE FROM fault_rows WHERE id IN "
        "(SELECT id FROM fault_rows WHERE bucket = $1 ORDER BY id LIMIT $2)"
    ),
    "DISPATCHER_HANDLERS__PURGE__PARAMS": "bucket,page_size",
    "DISPATCHER_HANDLERS__PURGE__PAGE_SIZE": "100",
}


async def test_sigkill_between_sql_pages_resumes_at_the_next_page(
    db_url: str, spawn: Spawn
) -> None:
    conn_rows = [("doomed", 1050), ("kept", 30)]
    await fetch(db_url, "CREATE TABLE fault_rows (id bigserial PRIMARY KEY, bucket text)")
    for bucket, n in conn_rows:
        await fetch(
            db_url,
            "INSERT INTO fault_rows (bucket) SELECT $1 FROM generate_series(1, $2)",
            bucket,
            n,
        )
    env = daemon_env(db_url, **PURGE_HANDLER)
    crashing = await spawn({**env, "DISPATCHER_FAULT": "sql_after_page"})
    await post_batch(
        crashing.base_url,
        [{"idempotency_key": "purge-doomed", "handler": "purge", "payload": {"bucket": "doomed"}}],
    )
    assert await crashing.wait() == -signal.SIGKILL
    # the first page and its progress committed together; nothing more
    job = (await fetch(db_url, "SELECT state, progress FROM dispatcher.jobs"))[0]
    assert (job["state"], json.loads(job["progress"])) == ("running", {"pages": 1, "rows": 100})
    assert await fetchval(db_url, "SELECT count(*) FROM fault_rows WHERE bucket = 'doomed'") == 950

    restarted = await spawn(env)
    await until_job_states(db_url, {"succeeded": 1}, timeout_s=30)
    assert await restarted.stop() == 0
    job = (await fetch(db_url, "SELECT attempt, result, progress FROM dispatcher.jobs"))[0]
    # 1 page before the crash + 10 after (9 full, 1 of 50): counted on, not started over
    assert job["attempt"] == 2
    assert json.loads(job["result"]) == {"pages": 11, "rows": 1050}
    remaining = await fetch(db_url, "SELECT bucket, count(*) AS n FROM fault_rows GROUP BY bucket")
    assert {r["bucket"]: r["n"] for r in remaining} == {"kept": 30}


async def test_sigkill_in_a_burst_loses_nothing_and_repeats_no_effect(
    db_url: str, spawn: Spawn
) -> None:
    # no UNIQUE constraint on purpose: a repeated effect would show up as a second row
    await create_effects_table(db_url)
    env = daemon_env(db_url, DISPATCHER_QUEUES__DEFAULT__MAX_INFLIGHT="8")
    daemon = await spawn(env)
    n = 600
    await post_batch(
        daemon.base_url,
        [
            {"idempotency_key": f"burst-{i}", "handler": "record", "payload": {"sleep_s": 0.005}}
            for i in range(n)
        ],
    )

    async def some_done() -> bool:
        return await fetchval(db_url, "SELECT count(*) FROM fault_effects") >= 150

    await wait_until(some_done, timeout_s=30, what="150 effects before the kill")
    daemon.signal(signal.SIGKILL)
    assert await daemon.wait() == -signal.SIGKILL
    at_kill = await states(db_url)
    assert at_kill.get("succeeded", 0) < n, at_kill  # the kill really landed mid-burst

    restarted = await spawn(env)
    await until_job_states(db_url, {"succeeded": n}, timeout_s=60)
    assert await restarted.stop() == 0
    effects = await effects_per_key(db_url)
    assert len(effects) == n and max(effects.values()) == 1, effects.most_common(3)
    done = await fetchval(
        db_url,
        "SELECT count(*) FROM dispatcher.jobs WHERE result = jsonb_build_object('recorded', key)",
    )
    assert done == n
