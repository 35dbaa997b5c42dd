"""The seed articles' incidents, replayed on real daemons (subprocesses) and real PostgreSQL.

1. 10,000 grant cleanups due at one instant; after ~6,000 have finished, the worker loses its
   leases while it keeps running (its database link stalls longer than the lease, through a
   proxy), a second instance rescues them, and the link comes back (invariants 1 and 2).
2. 200 webhook pushes in one batch under a rate limit, one answered 429 + Retry-After, and the
   daemon SIGKILLed the instant the target applies the 87th effect, before its answer reaches
   the daemon; a second daemon takes over (invariants 1, 2, 4 and 5).
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import web

from tests.faults.common import daemon_env, post_batch, states
from tests.faults.proxy import StallableProxy
from tests.faults.seed_handlers import EFFECTS_TABLE, LONG_RUNNING_MARK
from tests.harness import Target, serve_target, until_job_states, wait_until
from tests.harness.fixtures import Spawn

REVOKE_HANDLER = {
    "DISPATCHER_HANDLERS__REVOKE__KIND": "python",
    "DISPATCHER_HANDLERS__REVOKE__FUNCTION": "tests.faults.seed_handlers:revoke_expired_grants",
}


@contextlib.asynccontextmanager
async def connection(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    """One connection for a test's polling (not one per poll: the machine is small)."""
    conn = await asyncpg.connect(db_url)
    try:
        yield conn
    finally:
        await conn.close()


# -- 1. lease loss at scale ---------------------------------------------------------------------

N_GRANTS = 10_000
STALL_AFTER = 6_000
HELD_AT_STALL = 100
# every 1,000th grant is a long-running cleanup: longer than the lease, inside its transaction
LONG_RUNNING_EVERY = 1000
LONG_RUNNING_S = 3.0
STALL_MIN_S = 4.0  # twice the lease (DISPATCHER_LEASE_S=2 in BASE_ENV)


def grant_key(i: int) -> str:
    return f"lease-{i:05d}:revoke-upload-grants:2026-05-31"


def grant_index(key: str) -> int:
    return int(key.split(":")[0].removeprefix("lease-"))


def is_long_running(i: int) -> bool:
    return i % LONG_RUNNING_EVERY == LONG_RUNNING_EVERY - 1


async def enqueue_grants(conn: asyncpg.Connection, due_in_s: float) -> None:
    """Through the SQL door, all due at the same instant (the database's now + `due_in_s`)."""
    payloads = [
        json.dumps({"work_s": LONG_RUNNING_S} if is_long_running(i) else {})
        for i in range(N_GRANTS)
    ]
    created = await conn.fetchval(
        """
        SELECT count(*) FILTER (WHERE outcome = 'created') FROM dispatcher.enqueue_many(
            $1::text[],
            array_fill('revoke'::text, ARRAY[cardinality($1::text[])]),
            $2::text[]::jsonb[],
            array_fill(now() + make_interval(secs => $3), ARRAY[cardinality($1::text[])]))
        """,
        [grant_key(i) for i in range(N_GRANTS)],
        payloads,
        due_in_s,
    )
    assert created == N_GRANTS


@pytest.mark.timeout(180)
async def test_lease_loss_at_scale_every_grant_revoked_exactly_once(
    db_url: str, spawn: Spawn, tmp_path: Path
) -> None:
    async with connection(db_url) as conn:
        await conn.execute(EFFECTS_TABLE)
    trace = tmp_path / "executions"
    proxy = await StallableProxy(db_url).start()
    try:
        env = {**daemon_env(db_url, **REVOKE_HANDLER), "SEED_EXECUTIONS_FILE": str(trace)}
        # The server ends a transaction left idle by the stalled link after 1.5 s, as it would
        # on a real partition (keepalives): its row lock goes, so those leases can be rescued too,
        # and the stale attempt's in-transaction effect is rolled back.
        stalled_url = proxy.url_with(idle_in_transaction_session_timeout="1500")
        alpha = await spawn(
            {**env, "DISPATCHER_DATABASE_URL": stalled_url, "DISPATCHER_INSTANCE_NAME": "alpha"}
        )
        async with connection(db_url) as conn:
            await enqueue_grants(conn, due_in_s=2)

            async def effects() -> int:
                return await conn.fetchval("SELECT count(*) FROM seed_effects")

            async def leased_by_alpha() -> int:
                return await conn.fetchval(
                    "SELECT count(*) FROM dispatcher.jobs "
                    "WHERE state = 'running' AND lease_owner LIKE 'alpha:%'"
                )

            async def long_grant_running() -> bool:
                return bool(
                    await conn.fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND state = 'active' AND pid <> pg_backend_pid()"
                        " AND position($1 in query) > 0",
                        LONG_RUNNING_MARK,
                    )
                )

            async def stall_point() -> bool:
                # ~6,000 done; alpha holding a claim's worth of leases (it claims up to its
                # in-flight cap, then drains it: the count swings between ~0 and 200); and one
                # long-running grant in the middle of its transaction
                return (
                    await effects() >= STALL_AFTER
                    and await leased_by_alpha() >= HELD_AT_STALL
                    and await long_grant_running()
                )

            await wait_until(
                stall_point,
                timeout_s=90,
                interval_s=0.01,
                what=f"{STALL_AFTER} effects, alpha holding leases and a long grant running",
            )
            proxy.stall()
            stalled_at = time.monotonic()
            done_at_stall = await effects()
            held_at_stall = await leased_by_alpha()
            beta = await spawn({**env, "DISPATCHER_INSTANCE_NAME": "beta"})

            # alpha keeps running, but cannot heartbeat: every lease it held must expire and be
            # rescued (or its attempt's transaction end) before the link comes back
            async def all_rescued() -> bool:
                long_enough = time.monotonic() - stalled_at >= STALL_MIN_S
                return long_enough and await leased_by_alpha() == 0

            await wait_until(
                all_rescued,
                timeout_s=30,
                interval_s=0.1,
                what="alpha's leases expired and rescued while its link is stalled",
            )
            stall_s = time.monotonic() - stalled_at
            proxy.resume()
            await wait_until(
                lambda: _all_terminal(conn, N_GRANTS),
                timeout_s=120,
                interval_s=0.2,
                what=f"all {N_GRANTS} grants' jobs terminal",
            )
            final = await states(db_url)
            assert await alpha.stop() == 0, alpha.log_text()[-3000:]
            assert await beta.stop() == 0, beta.log_text()[-3000:]

            jobs = await conn.fetch("SELECT key, state, attempt, result FROM dispatcher.jobs")
            effect_rows = await conn.fetch("SELECT job_key, attempt, instance FROM seed_effects")
        executions = executions_per_key(trace)
    finally:
        await proxy.close()

    attempts = Counter(j["attempt"] for j in jobs)
    per_key = Counter(r["job_key"] for r in effect_rows)
    by_instance = Counter(r["instance"] for r in effect_rows)
    rerun = sum(1 for k, n in executions.items() if n > per_key.get(k, 0))
    print(
        f"\nstall after {done_at_stall} effects, alpha holding {held_at_stall} leases, "
        f"for {stall_s:.1f} s; final states {final}; attempts per job {dict(attempts)}; "
        f"effects per instance {dict(by_instance)}; executions {sum(executions.values())} "
        f"(keys executed more often than their effect: {rerun})"
    )
    # every job reached exactly one terminal outcome, and it is success: none dead, none lost
    assert final == {"succeeded": N_GRANTS}, final
    assert all(json.loads(j["result"]) == {"revoked": j["key"]} for j in jobs)
    # the business effect happened once per key: no key has two rows, none has none
    assert len(per_key) == N_GRANTS and max(per_key.values()) == 1, per_key.most_common(3)
    # the effect that committed is the attempt that completed: no stale attempt's effect survived
    final_attempt = {j["key"]: j["attempt"] for j in jobs}
    stale = [r for r in effect_rows if r["attempt"] != final_attempt[r["job_key"]]]
    assert stale == [], stale[:3]
    # the scenario really happened: alpha held leases at the stall, lost them, and the rescue
    # gave those jobs another attempt; alpha's stale attempts were refused (logged, not applied)
    assert held_at_stall > 0
    assert sum(n for a, n in attempts.items() if a > 1) > 0, attempts
    # the long-running grant cut off mid-transaction ran twice; its first effect never committed
    rerun_long = [k for k, n in executions.items() if n > 1 and is_long_running(grant_index(k))]
    assert rerun_long, executions.most_common(3)
    assert "lease lost" in alpha.log_text()
    assert "rescued" in beta.log_text() + alpha.log_text()
    assert set(executions) == set(per_key)


def executions_per_key(trace: Path) -> Counter[str]:
    return Counter(line.split()[0] for line in trace.read_text().splitlines())


async def _all_terminal(conn: asyncpg.Connection, n: int) -> bool:
    done = await conn.fetchval(
        "SELECT count(*) FROM dispatcher.jobs WHERE state IN ('succeeded', 'dead', 'cancelled')"
    )
    return bool(done >= n)


# -- 2. 429 and a crash mid-batch ----------------------------------------------------------------

N_RANGES = 200
KILL_AT = 87
THROTTLED = "range-010"
RETRY_AFTER_S = 3
# 200 starts at 50/s (burst 5): about four seconds of work, so the kill lands mid-batch
RATE_LIMITED = {
    "DISPATCHER_QUEUES__DEFAULT__RATE_PER_S": "50",
    "DISPATCHER_QUEUES__DEFAULT__BURST": "5",
}


class IdempotentTarget:
    """The business side of the webhook: applies its effect once per `Idempotency-Key` and
    answers a repeat with a 2xx no-op. The first request for THROTTLED gets 429 + Retry-After.
    When the KILL_AT-th effect is applied it SIGKILLs the daemon at once, before answering:
    the effect is done, and the daemon can never have recorded it."""

    def __init__(self) -> None:
        self.applied: list[str] = []  # keys, in the order their effect was applied
        self.redelivered: list[str] = []  # repeats of an applied key, answered as no-ops
        self.applied_at_kill: list[str] = []
        self.throttle_sent_at = 0.0
        self.kill: Any = None

    async def respond(self, request: web.Request, count: int) -> web.StreamResponse:
        key = request.headers["Idempotency-Key"]
        if key == THROTTLED and count == 1:
            response = web.StreamResponse(status=429, headers={"Retry-After": str(RETRY_AFTER_S)})
            await response.prepare(request)
            await response.write_eof()
            self.throttle_sent_at = time.monotonic()  # once written, not when decided
            return response
        if key in self.applied:
            self.redelivered.append(key)
            return web.json_response({"applied": False, "reason": "already applied"})
        self.applied.append(key)
        if len(self.applied) == KILL_AT:
            self.applied_at_kill = list(self.applied)
            self.kill()
        return web.json_response({"applied": True})


@pytest.mark.timeout(120)
async def test_429_and_sigkill_mid_batch_finish_every_range_with_one_effect_each(
    db_url: str, spawn: Spawn
) -> None:
    business = IdempotentTarget()
    target = Target(respond=business.respond)
    keys = [f"range-{i:03d}" for i in range(N_RANGES)]
    async with serve_target(target):
        env = daemon_env(db_url, **RATE_LIMITED)
        first = await spawn(env)
        business.kill = lambda: first.signal(signal.SIGKILL)
        await post_batch(
            first.base_url,
            [
                {"idempotency_key": k, "handler": "http", "target": {"url": target.url}}
                for k in keys
            ],
        )
        assert await first.wait(timeout_s=60) == -signal.SIGKILL
        async with connection(db_url) as conn:
            at_kill = await conn.fetch("SELECT key, state FROM dispatcher.jobs")
        running_at_kill = {r["key"] for r in at_kill if r["state"] == "running"}
        recorded_at_kill = {r["key"] for r in at_kill if r["state"] == "succeeded"}

        second = await spawn(env)
        await until_job_states(db_url, {"succeeded": N_RANGES}, timeout_s=60)
        assert await second.stop() == 0, second.log_text()[-3000:]

    final = await states(db_url)
    throttled_times = [r["at"] for r in target.requests if r["key"] == THROTTLED]
    print(
        f"\nkilled at effect {KILL_AT}: {len(recorded_at_kill)} recorded, "
        f"{len(running_at_kill)} running; redelivered as no-ops: {len(business.redelivered)}; "
        f"429 retried after {throttled_times[1] - business.throttle_sent_at:.2f} s"
    )
    assert final == {"succeeded": N_RANGES}, final
    # the kill came after exactly 87 effects, and the other 113 ranges all ran afterwards
    assert len(business.applied_at_kill) == KILL_AT
    not_done = set(keys) - set(business.applied_at_kill)
    assert len(not_done) == N_RANGES - KILL_AT
    assert set(business.applied[KILL_AT:]) == not_done
    # one effect per key: every key applied, none twice
    assert sorted(business.applied) == keys
    # the only repeats were of attempts in flight at the kill, each answered as a no-op; the
    # 87th, applied but never answered, is among them
    assert len(business.redelivered) == len(set(business.redelivered))
    assert set(business.redelivered) <= running_at_kill, (business.redelivered, running_at_kill)
    assert len(business.redelivered) <= len(running_at_kill)
    assert business.applied_at_kill[-1] in business.redelivered
    # nothing recorded as done was ever sent again (no new attempt after a recorded 2xx)
    sent = Counter(target.request_keys())
    assert all(sent[k] == 1 for k in recorded_at_kill - {THROTTLED}), sent.most_common(3)
    # the 429 was honoured: the next attempt came no sooner than Retry-After
    assert len(throttled_times) == 2, throttled_times
    assert throttled_times[1] - business.throttle_sent_at >= RETRY_AFTER_S
