"""The key ledger (migration 029): pruning a finished job keeps its key, fingerprint, id and
final state; the ledger itself is pruned after `retention.keys_s`, in bounded batches."""

from __future__ import annotations

import asyncpg

from dispatcher.config.settings import RetentionSettings
from dispatcher.db.jobs import JobRepository
from dispatcher.engine.pruning import Pruner
from tests.db.test_retention import seed


async def test_pruned_jobs_leave_their_keys_in_the_ledger(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        await seed(conn, "succeeded", 1500, 8, "ok-")
        await seed(conn, "dead", 3, 31, "dead-")
        await seed(conn, "succeeded", 4, 6, "young-")
        finished = await conn.fetchval(
            "SELECT finished_at FROM dispatcher.jobs WHERE key = 'dead-1'"
        )
        dead_id = await conn.fetchval("SELECT id FROM dispatcher.jobs WHERE key = 'dead-1'")
    pruned = await Pruner(JobRepository(pool), RetentionSettings(batch=1000)).run_once()
    assert (pruned["succeeded"], pruned["dead"], pruned["keys"]) == (1500, 3, 0)
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT key, request_hash, job_id, state, finished_at FROM dispatcher.key_ledger"
        )
        left = await conn.fetchval("SELECT count(*) FROM dispatcher.jobs")
    assert left == 4
    ledger = {r["key"]: r for r in rows}
    assert len(ledger) == 1503 and not any(k.startswith("young-") for k in ledger)
    dead = ledger["dead-1"]
    assert (dead["job_id"], dead["state"], dead["request_hash"]) == (dead_id, "dead", "h")
    assert dead["finished_at"] == finished


async def test_the_ledger_forgets_keys_after_keys_s_in_batches(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        await conn.execute(
            """INSERT INTO dispatcher.key_ledger (key, request_hash, job_id, state, finished_at)
               SELECT 'k-' || g, 'h', g, 'succeeded',
                      now() - make_interval(days => CASE WHEN g <= 2500 THEN 91 ELSE 89 END)
                 FROM generate_series(1, 2600) g"""
        )
    repo = JobRepository(pool)
    assert await repo.prune_keys(90 * 86400, 1000) == 1000  # one batch at a time
    pruned = await Pruner(repo, RetentionSettings(batch=1000)).run_once()
    assert pruned["keys"] == 1500
    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM dispatcher.key_ledger") == 100
