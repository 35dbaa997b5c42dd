"""Migration 061: the running jobs' two partial indexes (by lease, by queue) become one on
(queue, lease_expires_at), one entry fewer for every start and every renewed lease. The upgrade
keeps the tables and every other index; what the two served, the new one serves by index: a
queue's running jobs (its prefix) and the leases that expired across queues."""

from __future__ import annotations

import asyncpg
import pytest

from dispatcher.db.queries import query
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


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("rescue_expired_leases", (1000, [])),  # the due-scan's rescue, every round
        ("rescue_expired_leases", (1000, ["host:1:gone"])),  # after a daemon was judged gone
        ("poll_work", (["default"], ["noop:1"])),  # the idle daemon's look
    ],
)
async def test_the_lease_readers_read_the_running_index(
    conn: asyncpg.Connection, name: str, args: tuple[object, ...]
) -> None:
    """The statements that looked for expired leases by `jobs_running_lease` read the new
    index's entries, planned as a kept plan would be on a table the planner knows is large."""
    await conn.execute("SET enable_seqscan = off")
    plan = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN {query(name)}", *args))
    assert "using jobs_running on job_state" in plan, plan


async def test_a_queues_running_jobs_are_the_index_prefix(conn: asyncpg.Connection) -> None:
    """claim_grant's count of a queue's running jobs (as `jobs_running_queue` served it)."""
    await conn.execute("SET enable_seqscan = off")
    plan = "\n".join(
        r[0]
        for r in await conn.fetch(
            "EXPLAIN SELECT count(*) FROM (SELECT 1 FROM dispatcher.job_state"
            " WHERE queue = 'default' AND state = 'running' LIMIT 200) j"
        )
    )
    assert "using jobs_running on job_state" in plan and "Index Cond: (queue" in plan, plan
