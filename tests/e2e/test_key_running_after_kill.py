"""A daemon killed with SIGKILL while it holds keyed jobs, over both transports (migration 040):
each limited key's row counts its running jobs (key_state.running_seen), and claims trust that
count. The dead daemon's jobs are rescued by the survivor; the rescue gives their keys their
slots back, so the backlog drains (a count left at the cap would hold those keys forever), the
cap holds meanwhile, and every count ends equal to the truth: zero.
"""

from __future__ import annotations

import json
import signal

import asyncpg

from tests.harness import LOOPBACK_ENV, Target, serve_target, wait_until
from tests.harness.fixtures import Spawn
from tests.transports import transport, transport_env  # noqa: F401 (fixtures: both transports)

KEY_INFLIGHT, JOB_S = 2, 0.5
ACCOUNTS = {"acct-a": 8, "acct-b": 8}
ENV = {**LOOPBACK_ENV, "DISPATCHER_QUEUES__DEFAULT__KEY_MAX_INFLIGHT": str(KEY_INFLIGHT)}


async def enqueue(conn: asyncpg.Connection, target: Target) -> None:
    for account, n in ACCOUNTS.items():
        await conn.fetchval(
            """SELECT count(*) FROM dispatcher.enqueue_many(
                   (SELECT array_agg($2 || '-' || g) FROM generate_series(1, $1) g),
                   array_fill('http'::text, ARRAY[$1]),
                   array_fill(jsonb_build_object('account', $2::text), ARRAY[$1]), NULL, NULL,
                   array_fill($2::text, ARRAY[$1]), array_fill($3::jsonb, ARRAY[$1]))""",
            n,
            account,
            json.dumps({"url": target.url}),
        )


async def counts(conn: asyncpg.Connection) -> dict[str, tuple[int | None, int]]:
    """Each key's kept count (its starts less its ends) beside its running jobs counted now."""
    rows = await conn.fetch(
        "SELECT k.key, (k.running_seen - coalesce(d.n, 0))::int AS running_seen,"
        "       (SELECT count(*) FROM dispatcher.job_state s WHERE s.queue = k.queue"
        "           AND s.state = 'running' AND s.concurrency_key = k.key)::int AS truth"
        "  FROM dispatcher.key_state k"
        "  LEFT JOIN dispatcher.key_done d ON d.queue = k.queue AND d.key = k.key"
        " ORDER BY k.key"
    )
    return {r["key"]: (r["running_seen"], r["truth"]) for r in rows}


async def test_a_killed_daemons_keyed_jobs_give_their_keys_back_when_rescued(
    db_url: str,
    transport_env: dict[str, str],  # noqa: F811
    spawn: Spawn,
) -> None:
    env = {"DISPATCHER_DATABASE_URL": db_url, **ENV, **transport_env}
    conn = await asyncpg.connect(db_url)
    try:
        async with serve_target(Target(delay_s=30)) as target:  # the first calls hang
            doomed = await spawn(env)
            await enqueue(conn, target)
            every_slot = KEY_INFLIGHT * len(ACCOUNTS)
            await wait_until(
                lambda: len(target.requests) >= every_slot, timeout_s=30, what="every slot taken"
            )
            held = await counts(conn)
            assert held == {k: (KEY_INFLIGHT, KEY_INFLIGHT) for k in ACCOUNTS}, held
            doomed.signal(signal.SIGKILL)
            await doomed.wait()
            target.delay_s = JOB_S
            await spawn(env)

            async def drained() -> bool:
                n = await conn.fetchval(
                    "SELECT count(*) FROM dispatcher.jobs WHERE state = 'succeeded'"
                )
                seen = await counts(conn)
                assert all(kept is None or kept <= KEY_INFLIGHT for kept, _ in seen.values())
                return bool(n == sum(ACCOUNTS.values()))

            await wait_until(drained, timeout_s=90, interval_s=0.2, what="the backlog drained")
            assert await counts(conn) == {k: (0, 0) for k in ACCOUNTS}
    finally:
        await conn.close()
