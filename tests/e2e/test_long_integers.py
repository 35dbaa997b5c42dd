"""A job whose payload holds an integer of more than 4,300 digits, stored past the doors (which
refuse one: Python reads no longer integer from JSON text): the daemon claims it with the job
beside it and delivers both, the number exact in the signed body. Its
decoding had failed every job claimed with it, at each claim and each rescue."""

from __future__ import annotations

import json

import asyncpg

from tests.harness import Target, make_settings, running_daemon, serve_target, wait_until

STORE_PAST_THE_DOORS = """
INSERT INTO dispatcher.jobs (key, request_hash, queue, handler, handler_version, target, payload,
                             state, due_at, max_attempts, max_retry_age_s, budget_started_at)
VALUES ($1, 'h', 'default', 'http', 1, $2::jsonb, $3::jsonb, 'ready', now(), 3, 60, now())
RETURNING id"""


async def test_a_job_holding_an_integer_past_pythons_limit_harms_no_other(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        async with (
            serve_target(target := Target()),
            running_daemon(make_settings(db_url, scan_interval_s=3600)) as daemon,
        ):
            url = json.dumps({"url": target.url})
            long_id = await conn.fetchval(STORE_PAST_THE_DOORS, "long", url, '{"n": 1e5000}')
            await conn.fetchval(STORE_PAST_THE_DOORS, "plain", url, '{"n": 1}')
            await conn.execute("SELECT dispatcher.wake('ready')")

            async def both_succeeded() -> bool:
                return (
                    await conn.fetchval(
                        "SELECT count(*) FROM dispatcher.job_state WHERE state = 'succeeded'"
                    )
                    == 2
                )

            await wait_until(both_succeeded, timeout_s=20, what="both jobs delivered")
            assert sorted(r["body"] for r in target.requests) == [
                b'{"n":1' + b"0" * 5000 + b"}",
                b'{"n":1}',
            ]
            status, doc = await daemon.request("GET", f"/v1/jobs/{long_id}")
            assert (status, doc["key"], doc["state"]) == (200, "long", "succeeded")
    finally:
        await conn.close()
