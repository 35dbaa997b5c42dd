"""Receiver-controlled retries through a real daemon and a loopback target, on both
transports: `Dispatcher-Retry: abort` on any non-2xx answer ends the job dead at once as
`receiver_abort` (never another request); `Retry-After` is honoured on every retryable status,
408 included; an unknown `Dispatcher-Retry` value changes nothing."""

from __future__ import annotations

from collections import Counter
from typing import Any

import asyncpg
from aiohttp import web

from tests.harness import Target, make_settings, running_daemon, serve_target, wait_until

QUEUE = {"backoff_base_s": 0.01, "backoff_cap_s": 0.05, "max_attempts": 5}
CASES: dict[str, tuple[int, dict[str, str]]] = {
    "abort-503": (503, {"Dispatcher-Retry": "abort"}),
    "abort-500-any-case": (500, {"dispatcher-retry": " Abort "}),
    "abort-beats-retry-after": (429, {"Dispatcher-Retry": "abort", "Retry-After": "60"}),
    "abort-on-a-redirect": (307, {"Dispatcher-Retry": "abort", "Location": "/x"}),
    "408-retry-after": (408, {"Retry-After": "3600"}),
    "unknown-value": (503, {"Dispatcher-Retry": "later"}),
}


async def test_a_target_aborts_its_retries_or_sets_their_time(
    db_url: str, transport: dict[str, Any]
) -> None:
    async def respond(request: web.Request, count: int) -> web.StreamResponse:
        status, headers = CASES[request.headers["Idempotency-Key"]]
        if count > 1:
            return web.json_response({"ok": True})
        return web.Response(status=status, text="no more", headers=headers)

    target = Target(respond=respond)
    settings = make_settings(db_url, queues={"default": QUEUE}, **transport)
    conn = await asyncpg.connect(db_url)
    try:
        async with serve_target(target), running_daemon(settings) as d:
            for key in CASES:
                await d.post_job(key, {"handler": "http", "target": {"url": target.url}})

            async def settled() -> bool:
                n = await conn.fetchval(
                    "SELECT count(*) FROM dispatcher.jobs WHERE state IN ('dead', 'succeeded')"
                    " OR (key = '408-retry-after' AND state = 'scheduled' AND attempt = 1)"
                )
                return bool(n == len(CASES))

            await wait_until(settled, what="every job ended or waiting for its Retry-After")
        rows = await conn.fetch(
            "SELECT j.key, j.state, j.dead_reason, j.last_error, j.due_at, a.finished_at,"
            "       a.http_status"
            "  FROM dispatcher.jobs j JOIN dispatcher.attempt_history a ON a.job_id = j.id"
            "   AND a.attempt = 1"
        )
    finally:
        await conn.close()
    jobs = {r["key"]: r for r in rows}
    requests = Counter(target.request_keys())
    for key in (
        "abort-503",
        "abort-500-any-case",
        "abort-beats-retry-after",
        "abort-on-a-redirect",
    ):
        job = jobs[key]
        assert (job["state"], job["dead_reason"], requests[key]) == (
            "dead",
            "receiver_abort",
            1,
        ), key
        assert "Dispatcher-Retry: abort" in job["last_error"], job["last_error"]
        assert job["http_status"] == CASES[key][0]
    waiting = jobs["408-retry-after"]
    assert (waiting["state"], requests["408-retry-after"]) == ("scheduled", 1)
    assert (waiting["due_at"] - waiting["finished_at"]).total_seconds() == 3600
    assert (jobs["unknown-value"]["state"], requests["unknown-value"]) == ("succeeded", 2)
