"""Invariant 9, memory: the payload and target bytes a daemon holds for jobs in flight are
bounded (`max_inflight_payload_bytes`), and reads never load payload bytes they do not return.

A real daemon process drains jobs with payloads from 200 KiB to 10 MB stored through every door
(HTTP API within its body limit, `dispatcher.enqueue`, `dispatcher.enqueue_many`, rows inserted
directly), or answers 8 concurrent status reads of a 30 MB job; its peak resident set (VmHWM
from /proc/<pid>/status, the kernel's own high-water mark) must stay under DESIGN.md's 250 MB.
Before the budget (issue 20, defect 3) the drain below peaked at 476 MiB (idle 68) and the
reads at 461 MiB (idle 62); with it, 157 MiB and 62 MiB (2026-12-02, 2 shared cores).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import asyncpg
from aiohttp import web

from tests.harness import LOOPBACK_ENV, DaemonProcess, free_port, wait_until
from tests.harness.fixtures import Spawn
from tests.transports import transport, transport_env  # noqa: F401

RSS_LIMIT_BYTES = 250 * 1024 * 1024
MiB = 1024 * 1024
HTTP_BODY_LIMIT_BYTES = 1 * MiB
DRAIN_DEADLINE_S = 60.0
PAYLOAD_LIMIT_BYTES = 64 * MiB  # the largest limits.max_payload_bytes allowed


def peak_rss_bytes(pid: int) -> int:
    """The process's resident high-water mark, as the kernel counts it (VmHWM, in kB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


class CountingTarget:
    """A loopback target that reads each body, keeps only its size and key, and answers 200
    after `delay_s` (so deliveries overlap: the daemon holds many jobs in flight at once)."""

    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self.sizes: dict[str, int] = {}
        self.inflight: set[str] = set()
        self.max_inflight = 0
        # per key: the other keys in flight at any moment while it was
        self.beside: dict[str, set[str]] = {}
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        key = request.headers.get("Idempotency-Key", "")
        self.inflight.add(key)
        self.max_inflight = max(self.max_inflight, len(self.inflight))
        for other in self.inflight:
            self.beside.setdefault(other, set()).update(self.inflight - {other})
        try:
            body = await request.read()
            await asyncio.sleep(self.delay_s)
            self.sizes[key] = len(body)
            return web.json_response({"ok": True})
        finally:
            self.inflight.discard(key)


@contextlib.asynccontextmanager
async def counting_target(delay_s: float) -> AsyncIterator[CountingTarget]:
    target = CountingTarget(delay_s)
    app = web.Application(client_max_size=64 * MiB)
    app.router.add_post("/hook", target.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    target.url = f"http://127.0.0.1:{port}/hook"
    try:
        yield target
    finally:
        await runner.cleanup()


async def allow_large_payloads(conn: asyncpg.Connection) -> None:
    """Jobs far over the default per-job limit (limits.max_payload_bytes, 256 KiB) are the
    point here: the SQL door's limit raised before any daemon ran, as daemon_env's setting
    writes it at start (the direct insert below stands for rows stored before the limit
    existed, over any limit)."""
    await conn.execute(
        "UPDATE dispatcher.intake_settings SET max_payload_bytes = $1", PAYLOAD_LIMIT_BYTES
    )


async def store_through_sql_doors(conn: asyncpg.Connection, url: str) -> dict[str, int]:
    """Jobs due now through the SQL function doors and a direct insert, payloads built in the
    server (`repeat`): key -> payload characters. Targets as the README's SQL example writes
    them (no method, no headers)."""
    target = json.dumps({"url": url})
    sizes: dict[str, int] = {}
    await allow_large_payloads(conn)
    for n in range(30):  # dispatcher.enqueue, 3 MB each
        key = f"sql-{n}"
        await conn.execute(
            "SELECT dispatcher.enqueue($1, 'http', jsonb_build_object('blob', repeat('s', $2)),"
            " target => $3::jsonb)",
            key,
            3_000_000,
            target,
        )
        sizes[key] = 3_000_000
    many = {f"many-{n}": (200 * 1024 if n % 2 else 1_000_000) for n in range(12)}
    await conn.execute(
        """
        SELECT dispatcher.enqueue_many(
            array_agg(k), array_fill('http'::text, ARRAY[count(*)::int]),
            array_agg(jsonb_build_object('blob', repeat('m', n))),
            targets => array_fill($3::jsonb, ARRAY[count(*)::int]))
          FROM unnest($1::text[], $2::int[]) AS t(k, n)
        """,
        list(many),
        list(many.values()),
        target,
    )
    sizes.update(many)
    await conn.execute(
        """
        INSERT INTO dispatcher.jobs (key, request_hash, queue, handler, target, payload, state,
                                     due_at, max_attempts, max_retry_age_s, budget_started_at)
        SELECT 'direct-' || i, 'direct', 'default', 'http', $1::jsonb,
               jsonb_build_object('blob', repeat('d', 10000000)), 'scheduled', now(), 3, 86400,
               now()
          FROM generate_series(0, 3) AS i
        """,
        target,
    )
    sizes.update({f"direct-{i}": 10_000_000 for i in range(4)})
    return sizes


async def post_through_http(base_url: str, url: str, count: int) -> dict[str, int]:
    """`count` jobs of ~900 KiB through POST /v1/jobs (within its 1 MiB body limit)."""
    sizes: dict[str, int] = {}
    async with aiohttp.ClientSession() as s:
        for n in range(count):
            key = f"http-{n}"
            body = {"handler": "http", "target": {"url": url}, "payload": {"blob": "h" * 900_000}}
            async with s.post(
                f"{base_url}/v1/jobs", json=body, headers={"Idempotency-Key": key}
            ) as r:
                assert r.status == 202, await r.text()
            sizes[key] = 900_000
    return sizes


def daemon_env(db_url: str, **extra: str) -> dict[str, str]:
    return {
        "DISPATCHER_DATABASE_URL": db_url,
        "DISPATCHER_BODY_LIMIT_BYTES": str(HTTP_BODY_LIMIT_BYTES),
        "DISPATCHER_LIMITS__MAX_PAYLOAD_BYTES": str(PAYLOAD_LIMIT_BYTES),
        **LOOPBACK_ENV,
        **extra,
    }


async def stop(daemon: DaemonProcess) -> None:
    if daemon.proc is not None and daemon.proc.returncode is None:
        daemon.proc.kill()
        await daemon.proc.wait()


async def test_draining_large_payloads_from_every_door_stays_under_the_bound(
    db_url: str,
    transport_env: dict[str, str],  # noqa: F811
    spawn: Spawn,
) -> None:
    async with counting_target(delay_s=0.3) as target:
        conn = await asyncpg.connect(db_url)
        try:
            # paused while the jobs are stored, so the drain starts with all of them ready
            await conn.execute(
                "UPDATE dispatcher.queues SET paused = true, paused_at = now()"
                " WHERE name = 'default'"
            )
            sizes = await store_through_sql_doors(conn, target.url)
            daemon = await spawn(daemon_env(db_url, **transport_env))
            try:
                assert daemon.proc is not None
                sizes.update(await post_through_http(daemon.base_url, target.url, 8))
                idle = peak_rss_bytes(daemon.proc.pid)
                await conn.execute("UPDATE dispatcher.queues SET paused = false, paused_at = NULL")
                await wait_until(
                    lambda: len(target.sizes) >= len(sizes),
                    timeout_s=DRAIN_DEADLINE_S,
                    interval_s=0.1,
                    what=f"{len(sizes)} deliveries",
                )
                peak = peak_rss_bytes(daemon.proc.pid)
            finally:
                await stop(daemon)
        finally:
            await conn.close()
    total = sum(sizes.values())
    print(
        f"\n{transport_env.get('DISPATCHER_TRANSPORT', 'in-process')}: drain of {len(sizes)} "
        f"jobs, {total / MiB:.0f} MiB of payload: "
        f"idle {idle / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB"
    )
    for key, size in sizes.items():  # every body carried its whole payload
        assert target.sizes[key] >= size, key
    assert peak < RSS_LIMIT_BYTES, f"peak RSS {peak / MiB:.0f} MiB"


async def test_concurrent_status_reads_of_a_30_mb_job_stay_under_the_bound(
    db_url: str, spawn: Spawn
) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        await allow_large_payloads(conn)
        job_id = await conn.fetchval(
            """
            SELECT dispatcher.enqueue('huge', 'http',
                                      jsonb_build_object('blob', repeat('r', 30000000)),
                                      due_at => now() + interval '1 day',
                                      target => '{"url": "http://127.0.0.1:9/hook"}')
            """
        )
    finally:
        await conn.close()
    daemon = await spawn(daemon_env(db_url))
    try:
        assert daemon.proc is not None
        idle = peak_rss_bytes(daemon.proc.pid)
        async with aiohttp.ClientSession() as s:

            async def read() -> int:
                async with s.get(f"{daemon.base_url}/v1/jobs/{job_id}") as r:
                    assert r.status == 200, await r.text()
                    body = await r.read()
                    assert json.loads(body)["key"] == "huge"
                    return len(body)

            for _ in range(3):
                sizes = await asyncio.gather(*(read() for _ in range(8)))
        peak = peak_rss_bytes(daemon.proc.pid)
    finally:
        await stop(daemon)
    print(
        f"\n8 concurrent reads x 3 of a 30 MB job ({max(sizes)} bytes answered): "
        f"idle {idle / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB"
    )
    assert peak < RSS_LIMIT_BYTES, f"peak RSS {peak / MiB:.0f} MiB"


async def test_a_short_budget_claims_fewer_jobs_and_a_larger_job_runs_alone(
    db_url: str,
    transport_env: dict[str, str],  # noqa: F811
    spawn: Spawn,
) -> None:
    """A budget of 1 MiB: jobs of 300 kB run at most 3 at a time (the queue allows 200), and
    one of 3 MB, larger than the whole budget, still runs, with nothing beside it."""
    async with counting_target(delay_s=0.2) as target:
        conn = await asyncpg.connect(db_url)
        try:
            await allow_large_payloads(conn)
            await conn.execute(
                """SELECT dispatcher.enqueue_many(
                       array_agg('small-' || i), array_fill('http'::text, ARRAY[12]),
                       array_agg(jsonb_build_object('blob', repeat('s', 300000))),
                       targets => array_fill(jsonb_build_object('url', $1::text), ARRAY[12]))
                     FROM generate_series(0, 11) AS i""",
                target.url,
            )
            await conn.execute(
                "SELECT dispatcher.enqueue('big', 'http',"
                " jsonb_build_object('blob', repeat('b', 3000000)),"
                " target => jsonb_build_object('url', $1::text))",
                target.url,
            )
        finally:
            await conn.close()
        env = daemon_env(db_url, DISPATCHER_MAX_INFLIGHT_PAYLOAD_BYTES=str(MiB), **transport_env)
        daemon = await spawn(env)
        try:
            await wait_until(
                lambda: len(target.sizes) == 13, timeout_s=DRAIN_DEADLINE_S, what="13 deliveries"
            )
        finally:
            await stop(daemon)
    assert target.sizes["big"] >= 3_000_000
    assert target.beside.get("big", set()) == set(), target.beside["big"]
    assert 1 <= target.max_inflight <= 3, target.max_inflight
