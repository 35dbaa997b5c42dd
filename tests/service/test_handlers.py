"""Python and SQL effects, handler versions, operator retry and cancel — in process, real DB."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from dispatcher.client import enqueue
from dispatcher.errors import RetryLater
from dispatcher.observability import metrics
from tests.harness import make_settings, running_daemon, until_job_keys, wait_until

CALLS: dict[str, list[int]] = {}
GATE = asyncio.Event()


async def counting(job: Any, ctx: Any) -> dict[str, Any]:
    """Transactional: writes a row in the completion's transaction."""
    CALLS.setdefault(job.key, []).append(job.attempt)
    await ctx.connection.execute("INSERT INTO app_effects (job_key) VALUES ($1)", job.key)
    if job.payload.get("fail_times", 0) >= job.attempt:
        ctx.retry_later("not yet", 0.05)
    if job.payload.get("reject"):
        ctx.reject("payload says no")
    return {"attempt": job.attempt}


async def waits_for_gate(job: Any, ctx: Any) -> None:
    CALLS.setdefault(job.key, []).append(job.attempt)
    await GATE.wait()
    raise RetryLater("would retry", delay_s=0)


async def state_of(db_url: str, key: str) -> str | None:
    conn = await asyncpg.connect(db_url)
    try:
        return await conn.fetchval("SELECT state FROM dispatcher.jobs WHERE key = $1", key)
    finally:
        await conn.close()


def handlers(**extra: Any) -> dict[str, Any]:
    return {
        "count": {"kind": "python", "function": f"{__name__}:counting", **extra},
        "gate": {
            "kind": "python",
            "function": f"{__name__}:waits_for_gate",
            "transactional": False,
        },
    }


async def test_transactional_handler_rolls_back_failed_attempts(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    await conn.execute("CREATE TABLE app_effects (job_key text)")
    settings = make_settings(db_url, handlers=handlers())
    async with running_daemon(settings) as d:
        await d.post_job("twice-failing", {"handler": "count", "payload": {"fail_times": 2}})
        await d.post_job("refused", {"handler": "count", "payload": {"reject": True}})
        await until_job_keys(db_url, {"twice-failing": "succeeded", "refused": "dead"})
    assert CALLS["twice-failing"] == [1, 2, 3]
    # the two failed attempts' inserts rolled back with them; the successful one committed once
    rows = await conn.fetch("SELECT job_key FROM app_effects ORDER BY 1")
    assert [r["job_key"] for r in rows] == ["twice-failing"]
    job = await conn.fetchrow(
        "SELECT result, dead_reason FROM dispatcher.jobs WHERE key = 'refused'"
    )
    assert job["dead_reason"] == "rejected_by_handler"
    await conn.close()


async def test_worker_claims_only_handler_versions_it_can_run(
    db_url: str, transport: dict[str, Any]
) -> None:
    conn = await asyncpg.connect(db_url)
    await conn.execute("CREATE TABLE app_effects (job_key text)")
    # A newer release registered version 2 of the handler; its jobs carry version 2.
    await conn.execute(
        "INSERT INTO dispatcher.handlers (name, kind, current_version)"
        " VALUES ('count', 'python', 2)"
    )
    await enqueue(conn, "v2-job", "count", {})
    assert await conn.fetchval("SELECT handler_version FROM dispatcher.jobs") == 2
    CALLS.pop("v2-job", None)  # the other transport's run of this test
    refused = metrics.DELIVERIES_REFUSED.labels("default")
    refused_before = refused._value.get()
    if transport:
        # The old daemon's relay re-leases the refused job's outbox row about once a second; a
        # stop that lands between a lease and its publish leaves the row leased, the message
        # unsent, until the relay lease expires (30 s by default, past the new daemon's wait
        # below). A short lease lets the new daemon's relay publish it again soon.
        transport = {**transport, "rabbitmq": {**transport["rabbitmq"], "relay_lease_s": 2.0}}
    old = make_settings(db_url, **transport, handlers=handlers(version=1))
    async with running_daemon(old):
        await asyncio.sleep(0)  # let the claim loop run its first pass
        await wait_until(
            lambda: conn.fetchval("SELECT count(*) = 1 FROM dispatcher.jobs WHERE state = 'ready'"),
            what="job still waiting",
        )
        if transport:  # through the broker: delivered here, refused, handed back
            await wait_until(lambda: refused._value.get() >= refused_before + 1, timeout_s=10)
        # an old process must leave the v2 job alone, however many claim passes it makes
        for _ in range(10):
            assert await state_of(db_url, "v2-job") == "ready"
            await asyncio.sleep(0.05)
    assert CALLS.get("v2-job") is None
    new = make_settings(db_url, **transport, handlers=handlers(version=2, accepts_versions=[1]))
    async with running_daemon(new):
        await until_job_keys(db_url, {"v2-job": "succeeded"})
    await conn.close()


async def test_cancel_running_job_finishes_attempt_without_retry(db_url: str) -> None:
    GATE.clear()
    async with running_daemon(make_settings(db_url, handlers=handlers())) as d:
        job = await d.post_job("long", {"handler": "gate"})
        await until_job_keys(db_url, {"long": "running"})
        async with d.session.post(f"{d.base_url}/v1/jobs/{job['id']}/cancel") as r:
            assert r.status == 200
            assert (await r.json())["cancel_requested"] is True
        GATE.set()  # the attempt ends asking for a retry; the cancel wins
        await until_job_keys(db_url, {"long": "cancelled"})
    assert CALLS["long"] == [1]


async def test_operator_retry_gives_a_dead_job_a_new_budget(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    await conn.execute("CREATE TABLE app_effects (job_key text)")
    settings = make_settings(db_url, handlers=handlers())
    async with running_daemon(settings) as d:
        job = await d.post_job(
            "exhausted", {"handler": "count", "max_attempts": 1, "payload": {"fail_times": 1}}
        )
        await until_job_keys(db_url, {"exhausted": "dead"})
        status = await d.get_job(job["id"])
        assert status["dead_reason"] == "max_attempts"
        await conn.execute("UPDATE dispatcher.jobs SET payload = '{}' WHERE key = 'exhausted'")
        async with d.session.post(f"{d.base_url}/v1/jobs/{job['id']}/retry") as r:
            assert r.status == 200
        await until_job_keys(db_url, {"exhausted": "succeeded"})
        status = await d.get_job(job["id"])
    assert status["attempt"] == 1  # a fresh budget: attempt numbering restarted
    await conn.close()


async def test_sql_handler_commits_pages_with_progress(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    await conn.execute("CREATE TABLE sessions (id int PRIMARY KEY, expires_at timestamptz)")
    await conn.execute(
        "INSERT INTO sessions SELECT g, CASE WHEN g % 3 = 0 THEN now() + interval '1 day' "
        "ELSE now() - interval '1 day' END FROM generate_series(1, 2500) g"
    )
    expired = await conn.fetchval("SELECT count(*) FROM sessions WHERE expires_at < now()")
    settings = make_settings(
        db_url,
        handlers={
            "expire": {
                "kind": "sql",
                "page_size": 400,
                "params": ["cutoff", "page_size"],
                "statement": "DELETE FROM sessions WHERE id IN (SELECT id FROM sessions "
                "WHERE expires_at < $1::timestamptz LIMIT $2)",
            }
        },
    )
    async with running_daemon(settings) as d:
        cutoff = (await conn.fetchval("SELECT now()")).isoformat()
        job = await d.post_job("cleanup", {"handler": "expire", "payload": {"cutoff": cutoff}})
        await until_job_keys(db_url, {"cleanup": "succeeded"})
        status = await d.get_job(job["id"])
    pages = -(-expired // 400) + (1 if expired % 400 == 0 else 0)
    assert status["result"] == {"pages": pages, "rows": expired}
    assert await conn.fetchval("SELECT count(*) FROM sessions WHERE expires_at < now()") == 0
    assert await conn.fetchval("SELECT count(*) FROM sessions") == 2500 - expired
    await conn.close()


async def hangs(job: Any, ctx: Any) -> None:
    CALLS.setdefault(job.key, []).append(job.attempt)
    await asyncio.Event().wait()


async def returns_at_once(job: Any, ctx: Any) -> None:
    CALLS.setdefault(job.key, []).append(job.attempt)


async def test_a_handler_past_its_timeout_is_cancelled_and_retried_then_dead(db_url: str) -> None:
    untransactional = {"kind": "python", "transactional": False}
    settings = make_settings(
        db_url,
        handlers={
            "hang": {**untransactional, "function": f"{__name__}:hangs", "timeout_s": 0.3},
            "quick": {**untransactional, "function": f"{__name__}:returns_at_once"},
        },
        queues={"default": {"backoff_base_s": 0.05, "backoff_cap_s": 0.1}},
    )
    async with running_daemon(settings) as d:
        hung = [
            await d.post_job(f"hung-{i}", {"handler": "hang", "max_attempts": 2}) for i in (1, 2)
        ]
        quick = await d.post_job("quick", {"handler": "quick"})
        await until_job_keys(db_url, {job["key"]: "dead" for job in hung}, timeout_s=15)
        for job in hung:
            status = await d.get_job(job["id"])
            assert (status["attempt"], status["dead_reason"]) == (2, "max_attempts")
            assert status["last_error"] == "attempt timed out"
            assert CALLS[job["key"]] == [1, 2]
        assert (await d.get_job(quick["id"]))["state"] == "succeeded"
        async with d.session.get(f"{d.base_url}/metrics") as r:
            scrape = await r.text()
        # every in-flight slot came back
        assert 'dispatcher_inflight{queue="default"} 0.0' in scrape.splitlines()
