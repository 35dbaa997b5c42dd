"""The dispatch engine end to end, in process: real PostgreSQL, real loopback HTTP(S) targets.
Every test runs over both transports (in-process, RabbitMQ: tests/transports.py)."""

from __future__ import annotations

import ssl
import time
from collections import Counter
from typing import Any

import asyncpg
import trustme
from aiohttp import web

from dispatcher.observability import metrics
from tests.harness import (
    Target,
    make_settings,
    running_daemon,
    serve_target,
    starts_above_bucket,
    until_job_count,
    wait_until,
)


async def test_thousand_jobs_to_https_target_each_key_exactly_once(
    db_url: str, transport: dict[str, Any], tmp_path
) -> None:
    ca = trustme.CA()
    server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ssl)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    settings = make_settings(
        db_url, **transport, target_allow_http=False, http={"ca_file": str(ca_file)}
    )
    async with (
        serve_target(Target(), ssl_context=server_ssl) as target,
        running_daemon(settings) as d,
    ):
        assert target.url.startswith("https://")
        batch = [
            {
                "idempotency_key": f"grant-{i}",
                "handler": "http",
                "target": {"url": target.url},
                "payload": {"grant": i},
            }
            for i in range(1000)
        ]
        async with d.session.post(f"{d.base_url}/v1/jobs/batch", json={"jobs": batch}) as r:
            assert r.status == 200
            results = (await r.json())["results"]
        assert [x["status"] for x in results] == ["accepted"] * 1000
        await until_job_count(db_url, "succeeded", 1000)
    counts = Counter(target.request_keys())
    assert set(counts) == {f"grant-{i}" for i in range(1000)}
    assert max(counts.values()) == 1


async def test_429_with_retry_after_delays_the_next_attempt(
    db_url: str, transport: dict[str, Any]
) -> None:
    async def respond(request: web.Request, count: int) -> web.StreamResponse:
        if count == 1:
            return web.Response(status=429, headers={"Retry-After": "2"})
        return web.json_response({"ok": True})

    async with (
        serve_target(Target(respond=respond)) as target,
        running_daemon(make_settings(db_url, **transport)) as d,
    ):
        job = await d.post_job("rate-limited", {"handler": "http", "target": {"url": target.url}})
        await until_job_count(db_url, "succeeded", 1)
        status = await d.get_job(job["id"])
    first, second = target.requests
    assert second["at"] - first["at"] >= 2.0
    assert status["attempt"] == 2


async def test_400_is_dead_after_one_attempt(db_url: str, transport: dict[str, Any]) -> None:
    async def respond(request: web.Request, count: int) -> web.StreamResponse:
        return web.Response(status=400, text="grant id unknown")

    before = metrics.DEAD_LETTERS.labels("default", "http_4xx")._value.get()
    async with (
        serve_target(Target(respond=respond)) as target,
        running_daemon(make_settings(db_url, **transport)) as d,
    ):
        job = await d.post_job("bad-input", {"handler": "http", "target": {"url": target.url}})
        await until_job_count(db_url, "dead", 1)
        status = await d.get_job(job["id"])
    assert len(target.requests) == 1
    assert status["attempt"] == 1
    assert status["dead_reason"] == "http_4xx"
    assert "400" in status["last_error"] and "grant id unknown" in status["last_error"]
    assert metrics.DEAD_LETTERS.labels("default", "http_4xx")._value.get() == before + 1


async def test_500_retries_with_growing_delays_until_max_attempts(
    db_url: str, transport: dict[str, Any]
) -> None:
    async def respond(request: web.Request, count: int) -> web.StreamResponse:
        return web.Response(status=500)

    settings = make_settings(
        db_url,
        **transport,
        queues={"default": {"backoff_base_s": 0.2, "backoff_cap_s": 5, "max_attempts": 4}},
    )
    async with serve_target(Target(respond=respond)) as target, running_daemon(settings) as d:
        job = await d.post_job("flaky", {"handler": "http", "target": {"url": target.url}})
        await until_job_count(db_url, "dead", 1)
        status = await d.get_job(job["id"])
    assert len(target.requests) == 4
    assert status["dead_reason"] == "max_attempts"
    gaps = [b["at"] - a["at"] for a, b in zip(target.requests, target.requests[1:], strict=False)]
    # full jitter: each gap is at most the growing ceiling 0.2 * 2^(n-1) (+ scan slack)
    for n, gap in enumerate(gaps, start=1):
        assert gap <= 0.2 * 2 ** (n - 1) + 0.5, gaps


async def test_limits_hold_rate_and_inflight(db_url: str, transport: dict[str, Any]) -> None:
    settings = make_settings(
        db_url, **transport, queues={"default": {"rate_per_s": 50, "burst": 10, "max_inflight": 5}}
    )
    target = Target(delay_s=0.05)
    async with serve_target(target), running_daemon(settings) as d:
        batch = [
            {"idempotency_key": f"lim-{i}", "handler": "http", "target": {"url": target.url}}
            for i in range(120)
        ]
        async with d.session.post(f"{d.base_url}/v1/jobs/batch", json={"jobs": batch}) as r:
            assert r.status == 200
        await until_job_count(db_url, "succeeded", 120, timeout_s=30)
    starts = sorted(r["at"] for r in target.requests)
    worst = starts_above_bucket(starts, burst=10, rate_per_s=50)
    assert worst <= 1, f"{worst:.1f} starts above rate x t + burst"
    assert target.max_inflight <= 5


async def test_slow_targets_never_exceed_inflight_cap(
    db_url: str, transport: dict[str, Any]
) -> None:
    settings = make_settings(db_url, **transport, queues={"default": {"max_inflight": 5}})
    target = Target(delay_s=0.3)
    async with serve_target(target), running_daemon(settings) as d:
        batch = [
            {"idempotency_key": f"slow-{i}", "handler": "http", "target": {"url": target.url}}
            for i in range(20)
        ]
        async with d.session.post(f"{d.base_url}/v1/jobs/batch", json={"jobs": batch}) as r:
            assert r.status == 200
        await until_job_count(db_url, "succeeded", 20, timeout_s=30)
    assert target.max_inflight == 5


async def test_one_tenants_burst_does_not_starve_another(
    db_url: str, transport: dict[str, Any]
) -> None:
    # Over RabbitMQ the relay publishes fairly across tenants and only a window (publish_ahead
    # x max_inflight) ahead of the consumers, so the burst waits in the database, not in the
    # FIFO broker queue ahead of the small tenant's job.
    settings = make_settings(
        db_url, **transport, queues={"default": {"rate_per_s": 100, "burst": 5, "max_inflight": 5}}
    )
    target = Target()
    async with serve_target(target), running_daemon(settings) as d:
        big = [
            {
                "idempotency_key": f"big-{i}",
                "handler": "http",
                "tenant": "property-1",
                "target": {"url": target.url},
            }
            for i in range(1000)
        ]
        async with d.session.post(f"{d.base_url}/v1/jobs/batch", json={"jobs": big}) as r:
            assert r.status == 200
        await target.wait_for(lambda t: len(t.requests) >= 20, what="big tenant started")
        await d.post_job(
            "small-1", {"handler": "http", "tenant": "property-2", "target": {"url": target.url}}
        )
        await target.wait_for(lambda t: "small-1" in t.request_keys(), timeout_s=10, what="small")
        started_before_small = target.request_keys().index("small-1")
        big_remaining = 1000 - sum(1 for k in target.request_keys() if k.startswith("big-"))
    # The single job was served long before the burst drained (at 100/s it takes 10 s).
    assert big_remaining > 500, (started_before_small, big_remaining)


async def test_duplicate_delivery_is_a_noop_and_counted(
    db_url: str, transport: dict[str, Any]
) -> None:
    target = Target()
    before = metrics.DUPLICATE_DELIVERIES.labels("default")._value.get()
    settings = make_settings(db_url, **transport)
    async with serve_target(target), running_daemon(settings) as d:
        job = await d.post_job("once", {"handler": "http", "target": {"url": target.url}})
        await until_job_count(db_url, "succeeded", 1)
        relayed = transport.get("transport") == "rabbitmq"
        conn = await asyncpg.connect(db_url)
        try:  # a relay re-publishing the same message: a second outbox row for a finished job
            await conn.execute(
                "INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability) "
                "VALUES ($1, 'default', '', 'http:1')",
                job["id"],
            )
            await conn.execute("NOTIFY dispatcher_wake")
            if relayed:  # the delivery arrives after its outbox row is gone: a duplicate
                empty = "SELECT count(*) = 0 FROM dispatcher.outbox"
                await wait_until(lambda: conn.fetchval(empty))
                counted = metrics.DUPLICATE_DELIVERIES.labels("default")
                await wait_until(lambda: counted._value.get() >= before + 1, what="a duplicate")
            else:  # in process no claim reads outbox rows (migration 015): a later job runs,
                # the finished one does not run again
                await d.post_job("after", {"handler": "http", "target": {"url": target.url}})
                await until_job_count(db_url, "succeeded", 2)
        finally:
            await conn.close()
    assert target.request_keys() == (["once"] if relayed else ["once", "after"])
    assert metrics.DUPLICATE_DELIVERIES.labels("default")._value.get() == before + relayed


async def test_future_job_starts_at_its_due_time(db_url: str, transport: dict[str, Any]) -> None:
    target = Target()
    settings = make_settings(db_url, **transport, scan_interval_s=30)
    async with serve_target(target), running_daemon(settings) as d:
        async with d.session.get(f"{d.base_url}/healthz"):
            pass
        conn = await asyncpg.connect(db_url)
        due = await conn.fetchval("SELECT now() + interval '1.5 seconds'")
        await conn.close()
        await d.post_job(
            "later", {"handler": "http", "target": {"url": target.url}, "due_at": due.isoformat()}
        )
        submitted = time.monotonic()
        await target.wait_for(lambda t: t.request_keys() == ["later"], timeout_s=10)
    waited = target.requests[0]["at"] - submitted
    # the scan interval is 30 s: only the timer to the next due time can start it this soon
    assert 1.0 <= waited < 5.0, waited


async def test_expired_lease_is_rescued_and_the_attempt_counts(
    db_url: str, transport: dict[str, Any]
) -> None:
    target = Target()
    settings = make_settings(db_url, **transport)
    async with serve_target(target), running_daemon(settings) as d:
        conn = await asyncpg.connect(db_url)
        try:  # a job claimed by a process that died: running, lease already expired
            job_id = await conn.fetchval(
                "SELECT dispatcher.enqueue('orphan', 'http', '{}'::jsonb,"
                " now() + interval '1 hour',"
                " target => jsonb_build_object('url', $1::text))",
                target.url,
            )
            await conn.execute(
                "UPDATE dispatcher.jobs SET state = 'running', attempt = 1, lease_owner = 'dead:1',"
                " lease_expires_at = now() - interval '1 second', due_at = now() WHERE id = $1",
                job_id,
            )
        finally:
            await conn.close()
        await until_job_count(db_url, "succeeded", 1)
        status = await d.get_job(job_id)
    assert status["attempt"] == 2
    assert target.request_keys() == ["orphan"]
