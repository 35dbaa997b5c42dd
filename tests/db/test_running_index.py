"""Migration 061: the running jobs' two partial indexes (by lease, by queue) become one on
(queue, lease_expires_at), one entry fewer for every start and every renewed lease. The upgrade
keeps the tables and every other index; what the two served, the new one serves by index: a
queue's running jobs (its prefix) and the leases that expired across queues."""

from __future__ import annotations

import asyncpg

from tests.db.test_checks_as_domains import STORAGE, jobs_at_version, upgrade_to

RUNNING_INDEXES = """
SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index
 WHERE indrelid = 'dispatcher.job_state'::regclass
   AND pg_get_expr(indpred, indrelid) = '(state = ''running''::text)'
"""


async def test_the_upgrade_replaces_the_two_running_indexes_by_one(empty_db_url: str) -> None:
    conn = await asyncpg.connect(empty_db_url)
    try:
        ids = await jobs_at_version(conn, 60)
        before = dict(await conn.fetch(RUNNING_INDEXES))
        assert set(before) == {"dispatcher.jobs_running_lease", "dispatcher.jobs_running_queue"}
        storage = dict(await conn.fetch(STORAGE))
        assert await upgrade_to(conn, 61) == ["061_one_running_index.sql"]
        after = dict(await conn.fetch(RUNNING_INDEXES))
        assert list(after) == ["dispatcher.jobs_running"]
        assert "(queue, lease_expires_at)" in after["dispatcher.jobs_running"]
        kept = dict(await conn.fetch(STORAGE))
        assert {k: v for k, v in kept.items() if k != "jobs_running"} == {
            k: v for k, v in storage.items() if not k.startswith("jobs_running_")
        }  # the tables and every other index keep their storage
        assert [
            r["id"] for r in await conn.fetch("SELECT id FROM dispatcher.jobs ORDER BY id")
        ] == (ids)
    finally:
        await conn.close()


async def test_expired_leases_and_a_queues_running_jobs_are_read_by_the_index(
    conn: asyncpg.Connection,
) -> None:
    """The two readers' shapes (the due-scan's rescue and idle poll; the grant's count), planned
    as a kept plan would be on a table the planner knows is large."""
    await conn.execute("SET enable_seqscan = off")
    for statement in (
        "SELECT 1 FROM dispatcher.job_state"
        " WHERE state = 'running' AND lease_expires_at < now() LIMIT 1",
        "SELECT count(*) FROM (SELECT 1 FROM dispatcher.job_state"
        " WHERE queue = 'default' AND state = 'running' LIMIT 200) j",
    ):
        plan = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN {statement}"))
        assert "using jobs_running on" in plan, plan
