"""`dispatcher.jobs` is a view over the intent and state rows (migration 015). Scripts and
operators may still write through it: inserts, deletes and updates reach both tables, and an
update never undoes a concurrent transition it did not see."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from tests.harness import wait_until


@pytest.fixture
async def conns(db_url: str) -> AsyncIterator[tuple[asyncpg.Connection, asyncpg.Connection]]:
    a, b = await asyncpg.connect(db_url), await asyncpg.connect(db_url)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def ready_job(conn: asyncpg.Connection, key: str) -> int:
    job_id: int = await conn.fetchval(
        "SELECT dispatcher.enqueue($1, 'http', target => '{\"url\": \"https://x.example/\"}')",
        key,
    )
    return job_id


async def waiting_on_a_lock(conn: asyncpg.Connection, pid: int) -> bool:
    event = await conn.fetchval("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid)
    return bool(event == "Lock")


async def test_an_update_read_before_a_concurrent_claim_does_not_undo_it(
    conns: tuple[asyncpg.Connection, asyncpg.Connection],
) -> None:
    claimer, operator = conns
    job_id = await ready_job(claimer, "claimed-meanwhile")
    claim = claimer.transaction()
    await claim.start()
    await claimer.execute(
        "UPDATE dispatcher.job_state SET state = 'running', attempt = 1, lease_owner = 'w:1',"
        " lease_expires_at = now() + interval '1 minute', started_at = now() WHERE id = $1",
        job_id,
    )
    # the operator's statement reads the job as ready, then waits for the claim's row lock
    cancel = asyncio.create_task(
        operator.execute(
            "UPDATE dispatcher.jobs SET state = 'cancelled', finished_at = now()"
            " WHERE id = $1 AND state IN ('scheduled', 'ready')",
            job_id,
        )
    )
    pid = operator.get_server_pid()
    await wait_until(lambda: waiting_on_a_lock(claimer, pid), what="the cancel to wait")
    await claim.commit()
    assert await cancel == "UPDATE 0"  # it saw a ready job that is no longer ready: not applied
    row = await claimer.fetchrow(
        "SELECT state, attempt, lease_owner, finished_at FROM dispatcher.jobs WHERE id = $1", job_id
    )
    assert tuple(row) == ("running", 1, "w:1", None)


async def test_an_update_applies_only_the_columns_it_changed(
    conns: tuple[asyncpg.Connection, asyncpg.Connection],
) -> None:
    heartbeat, operator = conns
    job_id = await ready_job(heartbeat, "heartbeat-meanwhile")
    await heartbeat.execute(
        "UPDATE dispatcher.job_state SET state = 'running', attempt = 1, lease_owner = 'w:1',"
        " lease_expires_at = now() + interval '1 minute', started_at = now() WHERE id = $1",
        job_id,
    )
    beat = heartbeat.transaction()
    await beat.start()
    extended = await heartbeat.fetchval(
        "UPDATE dispatcher.job_state SET lease_expires_at = now() + interval '1 hour'"
        " WHERE id = $1 RETURNING lease_expires_at",
        job_id,
    )
    request = asyncio.create_task(
        operator.execute(
            "UPDATE dispatcher.jobs SET cancel_requested = true"
            " WHERE id = $1 AND state = 'running'",
            job_id,
        )
    )
    pid = operator.get_server_pid()
    await wait_until(lambda: waiting_on_a_lock(heartbeat, pid), what="the request to wait")
    await beat.commit()
    assert await request == "UPDATE 1"  # same attempt, same owner: applied
    row = await heartbeat.fetchrow(
        "SELECT cancel_requested, lease_expires_at, state FROM dispatcher.jobs WHERE id = $1",
        job_id,
    )
    # the heartbeat's extension stands: the view wrote only the column the operator set
    assert tuple(row) == (True, extended, "running")


async def test_insert_update_and_delete_through_the_view_reach_both_tables(
    conns: tuple[asyncpg.Connection, asyncpg.Connection],
) -> None:
    conn, _ = conns
    job_id = await conn.fetchval(
        "INSERT INTO dispatcher.jobs (key, request_hash, queue, tenant, handler, payload, state,"
        " due_at, max_attempts, max_retry_age_s, budget_started_at)"
        " VALUES ('scripted', 'h', 'default', 't-1', 'http', '{}', 'scheduled', now(), 3, 60,"
        " now()) RETURNING id"
    )
    state = await conn.fetchrow(
        "SELECT queue, tenant, capability, state, attempt FROM dispatcher.job_state WHERE id = $1",
        job_id,
    )
    assert tuple(state) == ("default", "t-1", "http:1", "scheduled", 0)
    assert await conn.fetchval("SELECT key FROM dispatcher.intents WHERE id = $1", job_id) == (
        "scripted"
    )

    # an intent column and a state column in one statement: each table gets its own
    await conn.execute(
        "UPDATE dispatcher.jobs SET tenant = 't-2', due_at = due_at + interval '1 day'"
        " WHERE id = $1",
        job_id,
    )
    assert await conn.fetchval(
        "SELECT i.tenant = s.tenant AND s.tenant = 't-2' AND s.due_at > now() + interval '23 h'"
        "  FROM dispatcher.intents i JOIN dispatcher.job_state s USING (id) WHERE id = $1",
        job_id,
    )
    with pytest.raises(asyncpg.FeatureNotSupportedError, match="id cannot change"):
        await conn.execute("UPDATE dispatcher.jobs SET id = id + 1000 WHERE id = $1", job_id)

    assert await conn.execute("DELETE FROM dispatcher.jobs WHERE id = $1", job_id) == "DELETE 1"
    left = await conn.fetchval(
        "SELECT (SELECT count(*) FROM dispatcher.intents WHERE id = $1)"
        " + (SELECT count(*) FROM dispatcher.job_state WHERE id = $1)",
        job_id,
    )
    assert left == 0
