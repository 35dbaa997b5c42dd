"""Jobs moved to ready ahead of their due time (the due-scan's `scan_ahead_s`, queries.sql
`scan_due`): the move says when each falls due, and no claim, look or metric treats one as
runnable before it is due, whichever way the claim picks (one tenant, the tenants' turns, the
many-small-tenants read). Over a relay nothing moves early; a replacement (debounce) of a job
moved ahead still replaces it."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import asyncpg
import pytest

from dispatcher.db.jobs import JobRepository
from dispatcher.db.pool import create_pool
from dispatcher.db.queries import query
from dispatcher.engine.due_scan import WAKE_OTHERS_FROM, DueScanner
from dispatcher.runtime.timing import TimingEngine
from tests.harness import wait_until

CAPS = ["report:1"]
OWNER = "ahead-test"
ENQUEUE = """SELECT dispatcher.enqueue(key => $1, handler => 'report', payload => '{}',
                                       due_at => $2, tenant => $3, on_key => $4)"""


pytestmark = [
    pytest.mark.registry(
        {"default": (10, 86_400)}, {"report": ("python", 1)}, due_at_past_tolerance_s=300
    ),
    pytest.mark.usefixtures("registry"),
]


async def db_now(conn: asyncpg.Connection) -> datetime:
    now: datetime = await conn.fetchval("SELECT now()")
    return now


async def enqueue(
    conn: asyncpg.Connection, key: str, due: datetime | None, tenant: str = ""
) -> int:
    job_id: int = await conn.fetchval(ENQUEUE, key, due, tenant, None)
    return job_id


async def state(conn: asyncpg.Connection, job_id: int) -> str:
    found: str = await conn.fetchval("SELECT state FROM dispatcher.job_state WHERE id = $1", job_id)
    return found


async def ready_left(repo: JobRepository) -> bool:
    return bool(await repo.pool.fetchval(query("ready_left"), "default", CAPS))


async def until_due(conn: asyncpg.Connection, due: datetime) -> None:
    async def passed() -> bool:
        return await db_now(conn) >= due

    await wait_until(passed, timeout_s=10, what="the due time to pass")


async def test_the_move_takes_jobs_due_within_ahead_and_says_when_they_fall_due(
    conn: asyncpg.Connection, repo: JobRepository
) -> None:
    now = await db_now(conn)
    due_now = await enqueue(conn, "now", None)
    await conn.execute("UPDATE dispatcher.job_state SET state = 'scheduled' WHERE id = $1", due_now)
    soon = await enqueue(conn, "soon", now + timedelta(seconds=30))
    later = await enqueue(conn, "later", now + timedelta(hours=1))

    done = await repo.scan_due(100, 60.0)

    assert (done.moved, done.due_now) == (2, 1)
    assert len(done.due_in_s) == 1 and 29 < done.due_in_s[0] <= 30.001
    assert done.due_counts == [1]
    assert [await state(conn, j) for j in (due_now, soon, later)] == ["ready", "ready", "scheduled"]
    # without ahead time, only what is due moves
    again = await enqueue(conn, "again", now + timedelta(seconds=30))
    assert (await repo.scan_due(100, 0.0)).moved == 0
    assert await state(conn, again) == "scheduled"


async def test_a_job_moved_ahead_is_claimed_at_its_due_time_not_before(
    conn: asyncpg.Connection, repo: JobRepository
) -> None:
    due = await db_now(conn) + timedelta(seconds=1)
    job_id = await enqueue(conn, "one", due)
    assert (await repo.scan_due(100, 5.0)).moved == 1
    assert await state(conn, job_id) == "ready"

    early = await repo.claim_limited("default", 10, CAPS, OWNER, 30)
    assert early.jobs == []
    assert early.drained  # the loop waits for the due-scan's wake-up, it does not spin
    assert not await repo.pool.fetchval(
        "SELECT dispatcher.ready_after_intake('default', $1::text[])", CAPS
    )
    assert not await ready_left(repo)
    seen = await repo.poll_work(["default"], CAPS)
    assert seen.ready == []
    assert await repo.oldest_ready_age() == {}  # not waiting yet: no alert fires for it

    await until_due(conn, due)
    claim = await repo.claim_limited("default", 10, CAPS, OWNER, 30)
    assert [j.id for j in claim.jobs] == [job_id]
    started = await conn.fetchrow(
        "SELECT started_at, due_at FROM dispatcher.job_state WHERE id = $1", job_id
    )
    assert started["started_at"] >= started["due_at"]


async def test_the_turns_take_only_due_jobs_of_each_tenant(
    conn: asyncpg.Connection, repo: JobRepository
) -> None:
    """Many small tenants (the read of claim_firsts) and a few (claim_pick's walk), each with a
    job moved ahead, half of them with one due now too: only those start before the due time."""
    due = await db_now(conn) + timedelta(seconds=1)
    tenants = [f"t{n:02}" for n in range(24)]
    now_ids, ahead_ids = set(), set()
    for n, tenant in enumerate(tenants):  # half of them hold only a job moved ahead
        ahead_ids.add(await enqueue(conn, f"{tenant}-ahead", due, tenant))
        if n % 2:
            now_ids.add(await enqueue(conn, f"{tenant}-now", None, tenant))
    await repo.scan_due(100, 5.0)

    taken: set[int] = set()
    for wanted in (32, 3, 3):  # the read (16 or more), then the walk
        claim = await repo.claim_limited("default", wanted, CAPS, OWNER, 30)
        taken |= {j.id for j in claim.jobs}
    while claim.jobs:
        claim = await repo.claim_limited("default", 3, CAPS, OWNER, 30)
        taken |= {j.id for j in claim.jobs}
    assert taken == now_ids
    assert not await ready_left(repo)

    await until_due(conn, due)
    claim = await repo.claim_limited("default", 100, CAPS, OWNER, 30)
    assert {j.id for j in claim.jobs} == ahead_ids
    early = await conn.fetchval(
        "SELECT count(*) FROM dispatcher.job_state WHERE started_at < due_at"
    )
    assert early == 0


async def test_a_relay_moves_nothing_early(conn: asyncpg.Connection, repo: JobRepository) -> None:
    await conn.execute("UPDATE dispatcher.intake_settings SET ready_outbox = true")
    job_id = await enqueue(conn, "relayed", await db_now(conn) + timedelta(seconds=30))
    done = await repo.scan_due(100, 60.0)
    assert done.moved == 0 and done.due_in_s == []
    assert await state(conn, job_id) == "scheduled"
    assert await conn.fetchval("SELECT count(*) FROM dispatcher.outbox") == 0


async def test_a_job_moved_ahead_is_still_replaced_by_a_debounce(
    conn: asyncpg.Connection, repo: JobRepository
) -> None:
    due = await db_now(conn) + timedelta(seconds=30)
    job_id = await enqueue(conn, "debounced", due)
    await repo.scan_due(100, 60.0)
    assert await state(conn, job_id) == "ready"

    later = due + timedelta(seconds=60)
    row = await conn.fetchrow(
        "SELECT r.outcome, r.state, r.due_at FROM dispatcher.enqueue_many("
        " keys => ARRAY['debounced'], handlers => ARRAY['report'], payloads => ARRAY[$1::jsonb],"
        " due_ats => ARRAY[$2::timestamptz], on_keys => ARRAY['replace']) r",
        json.dumps({"n": 2}),
        later,
    )
    assert (row["outcome"], row["state"], row["due_at"]) == ("replaced", "scheduled", later)
    assert await state(conn, job_id) == "scheduled"  # the due-scan moves it anew, in time
    assert (await repo.claim_limited("default", 10, CAPS, OWNER, 30)).jobs == []


async def test_a_relay_switched_on_sends_jobs_moved_ahead_back_to_wait(
    conn: asyncpg.Connection, repo: JobRepository
) -> None:
    """A daemon started with the relay transport over jobs an in-process one moved ahead: they
    get no outbox row (the relay would deliver them at once) and wait as scheduled; those due
    get theirs."""
    due = await db_now(conn) + timedelta(seconds=30)
    ahead = await enqueue(conn, "moved-ahead", due)
    await repo.scan_due(100, 60.0)
    waiting = await enqueue(conn, "due-now", None)
    assert [await state(conn, j) for j in (ahead, waiting)] == ["ready", "ready"]

    await repo.sync_registry(
        {"default": (10, 86_400)},
        {"report": ("python", 1)},
        due_at_past_tolerance_s=300,
        ready_outbox=True,
    )
    assert [await state(conn, j) for j in (ahead, waiting)] == ["scheduled", "ready"]
    outboxed = await conn.fetch("SELECT job_id FROM dispatcher.outbox")
    assert [r["job_id"] for r in outboxed] == [waiting]


async def test_a_notice_that_cannot_be_sent_is_said_and_harms_nothing(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The notice to the other daemons at a burst's instant, with the database gone: a
    warning (the others find the jobs by their work poll), and the mover's own wake-up
    happened first."""
    closed = await create_pool(db_url, size=1, min_size=1)
    await closed.close()
    woken: list[int] = []
    scanner = DueScanner(
        JobRepository(closed),
        TimingEngine(),
        batch=10,
        interval_s=60,
        on_ready=lambda: woken.append(1),
    )
    scanner._wake_workers_in(0.0, WAKE_OTHERS_FROM)

    async def notice_ended() -> bool:
        return bool(woken) and not scanner._notices

    await wait_until(notice_ended, timeout_s=5, what="the notice to end")
    assert woken == [1]
    assert "could not tell the other daemons" in caplog.text
    await scanner.stop()
