"""Keys outlive their jobs, through a real daemon: a job runs once, retention prunes it, and a
replay of its request through each door (HTTP, a batch item, the SQL door) answers with the
original job's id and final state and runs nothing; another body under that key is a 409."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import asyncpg
import pytest

from tests.harness import LOOPBACK_ENV, Target, daemon_process, post, serve_target, wait_until

ENV = {
    **LOOPBACK_ENV,
    # succeeded jobs are pruned at the pruner's next round, every 0.2 s
    "DISPATCHER_RETENTION__SUCCEEDED_S": "0",
    "DISPATCHER_RETENTION__INTERVAL_S": "0.2",
}
SQL_ENQUEUE = """SELECT dispatcher.enqueue('sql-once', 'http', '{"n": 1}'::jsonb,
                                           target => jsonb_build_object('url', $1::text))"""


@pytest.fixture
async def target() -> AsyncIterator[Target]:
    async with serve_target(Target()) as t:
        yield t


async def test_a_replay_after_pruning_answers_the_original_job_and_runs_nothing(
    db_url: str, target: Target
) -> None:
    body = {"handler": "http", "target": {"url": target.url}, "payload": {"n": 1}}
    conn = await asyncpg.connect(db_url)
    try:
        async with daemon_process({"DISPATCHER_DATABASE_URL": db_url, **ENV}) as daemon:
            status, first = await post(daemon, "once", body)
            assert status == 202, first
            sql_first = await conn.fetchval(SQL_ENQUEUE, target.url)

            async def in_ledger() -> bool:
                return bool(await conn.fetchval("SELECT count(*) = 2 FROM dispatcher.key_ledger"))

            await wait_until(in_ledger, timeout_s=30, what="the job pruned into the ledger")
            assert sorted(target.request_keys()) == ["once", "sql-once"]

            async with aiohttp.ClientSession() as s:
                async with s.post(
                    f"{daemon.base_url}/v1/jobs", json=body, headers={"Idempotency-Key": "once"}
                ) as r:
                    assert r.status == 200, await r.text()
                    assert r.headers["Idempotent-Replayed"] == "true"
                    replay = await r.json()
                async with s.post(
                    f"{daemon.base_url}/v1/jobs/batch",
                    json={"jobs": [{"idempotency_key": "once", **body}]},
                ) as r:
                    (item,) = (await r.json())["results"]
            assert replay["id"] == first["id"] and replay["state"] == "succeeded"
            assert replay["pruned"] is True and "pruned" in replay["detail"]
            assert (item["status"], item["id"], item["pruned"]) == ("existing", first["id"], True)
            # the SQL door: its own job, replayed through it after pruning
            assert await conn.fetchval(SQL_ENQUEUE, target.url) == sql_first

            status, conflict = await post(daemon, "once", {**body, "payload": {"n": 2}})
            assert status == 409, conflict

            # nothing was created for the key, so nothing can run: a later job runs alone
            assert await conn.fetchval("SELECT count(*) FROM dispatcher.jobs") == 0
            status, _ = await post(daemon, "later", body)
            assert status == 202
            await wait_until(
                lambda: "later" in target.request_keys(), timeout_s=30, what="the later job"
            )
            assert sorted(target.request_keys()) == ["later", "once", "sql-once"]
    finally:
        await conn.close()
