"""Per-job contracts on real daemons (issue 23 points 6 and 7): a job's own deadline cuts a
Python handler (inline or transactional) and a SQL handler short on both transports; a job past
its time to live ends `dead` (`expired`) instead of starting late, counted in the dead-letter
metric; a job's callback is pushed once, signed, through a SIGKILL between the effect and the
completion and one between the completion and the ack."""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import aiohttp
import asyncpg
import pytest
from standardwebhooks.webhooks import Webhook

from tests.harness import (
    LOOPBACK_ENV,
    Target,
    make_settings,
    running_daemon,
    serve_target,
    wait_until,
)
from tests.harness.fixtures import Spawn
from tests.transports import transport  # noqa: F401 (a fixture: both transports)

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
NAP = "tests.e2e.contract_handlers:nap"
HANDLERS = {
    "nap": {"kind": "python", "function": NAP, "transactional": False, "timeout_s": 300},
    "nap_tx": {"kind": "python", "function": NAP, "timeout_s": 300},
    "sleep_sql": {
        "kind": "sql",
        "statement": "SELECT pg_sleep($1::float8)",
        "params": ["s"],
        "timeout_s": 300,
    },
}


async def with_contract(conn: asyncpg.Connection, job_id: int, **contract: Any) -> None:
    """Give a waiting job its contract, then make it due (what the doors write)."""
    state = {k: v for k, v in contract.items() if k == "expires_at"}
    intent = {k: v for k, v in contract.items() if k != "expires_at"}
    async with conn.transaction():
        for column, value in intent.items():
            value = json.dumps(value) if isinstance(value, dict) else value
            await conn.execute(
                f"UPDATE dispatcher.intents SET {column} = $2 WHERE id = $1", job_id, value
            )
        for column, value in state.items():
            await conn.execute(
                f"UPDATE dispatcher.job_state SET {column} = $2 WHERE id = $1", job_id, value
            )
        await conn.execute(
            "UPDATE dispatcher.job_state SET due_at = now(), has_callback = $2 WHERE id = $1",
            job_id,
            "on_success" in intent or "on_failure" in intent,
        )


async def job_row(conn: asyncpg.Connection, job_id: int) -> asyncpg.Record:
    row = await conn.fetchrow("SELECT * FROM dispatcher.jobs WHERE id = $1", job_id)
    assert row is not None
    return row


LATER = "2099-01-01T00:00:00Z"


async def test_a_jobs_own_deadline_cuts_python_and_sql_handlers_short(
    db_url: str,
    transport: dict[str, Any],  # noqa: F811
) -> None:
    conn = await asyncpg.connect(db_url)
    settings = make_settings(db_url, handlers=HANDLERS, **transport)
    async with running_daemon(settings) as d:
        ids = {}
        for handler in HANDLERS:
            for own in ("own", "none"):
                body = {
                    "handler": handler,
                    "payload": {"s": 30 if own == "own" else 0.05},
                    "due_at": LATER,
                    "max_attempts": 1,
                }
                ids[handler, own] = (await d.post_job(f"{handler}-{own}", body))["id"]
        started = time.monotonic()
        for (_handler, own), job_id in ids.items():
            await with_contract(conn, job_id, **({"timeout_s": 0.5} if own == "own" else {}))

        async def all_ended() -> bool:
            rows = [await job_row(conn, i) for i in ids.values()]
            return all(r["state"] in ("succeeded", "dead") for r in rows)

        await wait_until(all_ended, timeout_s=20, what="every job to end")
        # the handlers' own 300 s never came into it
        assert time.monotonic() - started < 15
        for (handler, own), job_id in ids.items():
            row = await job_row(conn, job_id)
            if own == "own":
                assert (row["state"], row["last_error"]) == ("dead", "attempt timed out"), handler
            else:
                assert row["state"] == "succeeded", (handler, row["last_error"])
    await conn.close()


async def test_a_job_past_its_ttl_ends_expired_instead_of_starting_late(
    db_url: str,
    transport: dict[str, Any],  # noqa: F811
) -> None:
    conn = await asyncpg.connect(db_url)
    settings = make_settings(db_url, handlers=HANDLERS, **transport)
    async with running_daemon(settings) as d:
        counted = await expired_count(d)
        await conn.execute(
            "UPDATE dispatcher.queues SET paused = true, paused_at = now() WHERE name = 'default'"
        )
        late = (await d.post_job("late", {"handler": "nap", "due_at": LATER}))["id"]
        kept = (await d.post_job("kept", {"handler": "nap", "due_at": LATER}))["id"]
        await with_contract(
            conn, late, expires_at=await conn.fetchval("SELECT now() + interval '1 s'")
        )
        await with_contract(
            conn, kept, expires_at=await conn.fetchval("SELECT now() + interval '1 h'")
        )

        async def expired() -> bool:
            return (await job_row(conn, late))["state"] == "dead"

        await wait_until(expired, timeout_s=10, what="the job to expire while its queue waits")
        row = await job_row(conn, late)
        assert (row["dead_reason"], row["attempt"], row["started_at"]) == ("expired", 0, None)
        assert (await job_row(conn, kept))["state"] == "ready"
        await conn.execute(
            "UPDATE dispatcher.queues SET paused = false, paused_at = NULL WHERE name = 'default'"
        )

        async def kept_ran() -> bool:
            return (await job_row(conn, kept))["state"] == "succeeded"

        await wait_until(kept_ran, what="the job inside its TTL to run once resumed")
        # the registry is the process's: counted once more than before this test
        assert await expired_count(d) == counted + 1
    await conn.close()


async def expired_count(d: Any) -> float:
    async with d.session.get(f"{d.base_url}/metrics") as r:
        text = await r.text()
    name = 'dispatcher_dead_letters_total{queue="default",reason="expired"} '
    line = next((x for x in text.splitlines() if x.startswith(name)), name + "0")
    return float(line.split()[-1])


async def callback_jobs(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return list(
        await conn.fetch(
            "SELECT j.* FROM dispatcher.jobs j JOIN dispatcher.intents i ON i.id = j.id"
            " WHERE i.callback_of IS NOT NULL ORDER BY j.id"
        )
    )


@pytest.mark.parametrize("fault", ["after_effect", "after_complete"])
async def test_a_callback_is_pushed_once_through_a_sigkill_around_the_completion(
    db_url: str, fault: str, spawn: Spawn
) -> None:
    conn = await asyncpg.connect(db_url)
    env = {
        "DISPATCHER_DATABASE_URL": db_url,
        **LOOPBACK_ENV,
        "DISPATCHER_LEASE_S": "2",
        "DISPATCHER_HTTP__SIGNING_SECRET": SECRET,
    }
    async with serve_target(Target()) as effect, serve_target(Target()) as hooks:
        crashing = await spawn({**env, "DISPATCHER_FAULT": fault})
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                f"{crashing.base_url}/v1/jobs",
                json={"handler": "http", "target": {"url": effect.url}, "due_at": LATER},
                headers={"Idempotency-Key": "order-7"},
            ) as r,
        ):
            assert r.status == 202, await r.text()
            job_id = (await r.json())["id"]
        await with_contract(conn, job_id, on_success={"url": hooks.url})
        assert await crashing.wait() == -signal.SIGKILL
        restarted = await spawn(env)

        async def pushed() -> bool:
            jobs = await callback_jobs(conn)
            return len(jobs) == 1 and jobs[0]["state"] == "succeeded"

        await wait_until(pushed, timeout_s=30, what="the callback to be delivered")
        assert await restarted.stop() == 0
    assert len(hooks.requests) == 1
    sent = hooks.requests[0]
    event = Webhook(SECRET).verify(sent["body"], sent["headers"])
    assert event["type"] == "job.succeeded"
    data = event["data"]
    attempts = 2 if fault == "after_effect" else 1
    assert (data["id"], data["key"], data["state"], data["attempts"]) == (
        job_id,
        "order-7",
        "succeeded",
        attempts,
    )
    assert data["http_status"] == 200
    assert len(effect.requests) == attempts  # at least once: the kill before the completion
    await conn.close()
