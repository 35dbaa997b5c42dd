"""Priorities and tenant turns on a real daemon, on both transports (in process; RabbitMQ, where
the relay publishes in the claim's order: migration 023). The order rules themselves, and the
claim's fairness bound, are tested statement by statement in tests/db/test_claim_order.py and
tests/db/test_relay_order.py."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from tests.harness import make_settings, running_daemon, wait_until

STARTED: list[str] = []  # keys, in the order the handler ran them (this process's daemon)


async def record(job: Any, ctx: Any) -> dict[str, Any]:
    STARTED.append(job.key)
    return {}


HANDLERS = {"record": {"kind": "python", "function": f"{__name__}:record"}}


async def enqueue(conn: asyncpg.Connection, items: str) -> None:
    """One enqueue_many of `record` jobs: `items` is SQL giving (key, tenant, priority) rows."""
    await conn.execute(f"""
        WITH items AS ({items})
        SELECT count(*) FROM dispatcher.enqueue_many(
               (SELECT array_agg(k ORDER BY k) FROM items AS i(k, t, p)),
               (SELECT array_agg('record'::text) FROM items),
               (SELECT array_agg('{{}}'::jsonb) FROM items),
               tenants => (SELECT array_agg(t ORDER BY k) FROM items AS i(k, t, p)),
               priorities => (SELECT array_agg(p ORDER BY k) FROM items AS i(k, t, p)))""")


async def pause(conn: asyncpg.Connection, paused: bool) -> None:
    await conn.execute(
        "UPDATE dispatcher.queues SET paused = $1, paused_at = CASE WHEN $1 THEN now() END"
        " WHERE name = 'default'",
        paused,
    )
    await conn.execute("NOTIFY dispatcher_wake, 'ready'")


async def succeeded(conn: asyncpg.Connection, like: str) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM dispatcher.jobs WHERE state = 'succeeded' AND key LIKE $1", like
        )
    )


async def test_a_daemon_starts_the_lowest_priority_first_then_tenants_in_turn(
    db_url: str, transport: dict[str, Any]
) -> None:
    STARTED.clear()
    settings = make_settings(
        db_url, **transport, handlers=HANDLERS, queues={"default": {"max_inflight": 1}}
    )
    async with running_daemon(settings):
        conn = await asyncpg.connect(db_url)
        try:
            await pause(conn, True)  # the backlog lands whole before anything is claimed
            await enqueue(
                conn,
                "VALUES ('a1', 'a', 10), ('a2', 'a', 10), ('a3', 'a', 10), ('b1', 'b', 10),"
                " ('b2', 'b', 10), ('c1', 'c', -50), ('d1', 'd', 100), ('e1', 'a', 0)",
            )
            await pause(conn, False)
            await wait_until(lambda: succeeded(conn, "%"), what="the first job")
            await wait_until(lambda: len(STARTED) == 8, what="every job", timeout_s=30)
        finally:
            await conn.close()
    assert STARTED == ["c1", "e1", "a1", "b1", "a2", "b2", "a3", "d1"]


# 110,000 jobs, enqueued, analysed and drained: its own waits allow 450 s, and on a slow machine
# beside CI's other workers the drain over RabbitMQ took more than the suite's 120 s default
@pytest.mark.timeout(480)
async def test_an_urgent_job_overtakes_a_backlog_and_small_tenants_beat_a_big_one(
    db_url: str, transport: dict[str, Any]
) -> None:
    """10,000 tenants with one job each beside one tenant with 100,000: every small tenant's
    job starts within the first turn of all 10,001 (the big one starts about once a turn), and
    a job at a lower priority value posted mid-drain starts ahead of the whole backlog."""
    STARTED.clear()
    settings = make_settings(db_url, **transport, handlers=HANDLERS)
    async with running_daemon(settings) as d:
        conn = await asyncpg.connect(db_url)
        try:
            await pause(conn, True)
            await enqueue(
                conn,
                "SELECT 'big-' || lpad(g::text, 6, '0'), 'big', 0"
                " FROM generate_series(1, 100000) g",
            )
            await enqueue(
                conn,
                "SELECT 'small-' || lpad(g::text, 5, '0'), 's' || lpad(g::text, 5, '0'), 0"
                " FROM generate_series(1, 10000) g",
            )
            await conn.execute("ANALYZE dispatcher.intents, dispatcher.job_state")
            await pause(conn, False)
            await wait_until(lambda: len(STARTED) >= 2_000, timeout_s=120, what="2,000 starts")
            urgent_after = len(STARTED)
            await d.post_job("urgent", {"handler": "record", "tenant": "big", "priority": -1})
            await wait_until(lambda: "urgent" in STARTED, timeout_s=30, what="the urgent job")
            overtaken = STARTED.index("urgent") - urgent_after
            await wait_until(
                lambda: sum(k.startswith("small-") for k in STARTED) == 10_000,
                timeout_s=300,
                what="every small tenant",
            )
            first_turn = STARTED[: STARTED.index("urgent")] + STARTED[STARTED.index("urgent") + 1 :]
            first_turn = first_turn[:10_001]
        finally:
            await conn.close()
    # started ahead of the ready backlog (what was claimed or published already goes first)
    assert overtaken <= 1_000, overtaken
    smalls = sum(k.startswith("small-") for k in first_turn)
    bigs = sum(k.startswith("big-") for k in first_turn)
    # every small tenant within about one turn of all tenants (claims run side by side: a few
    # claims' worth of slack), the big tenant about once per claim walk, not most of each claim
    assert smalls >= 9_000, (smalls, bigs)
    assert bigs <= 1_001, (smalls, bigs)
