"""Retry-After through a real daemon and a loopback target: honoured with no cap of its own (the
one-day cap is gone) on 429 and 503, and on a 5xx or a redirect that sends it; in both forms
(delta-seconds and HTTP date); up to the job's retry age, past which the job is dead as
`retry_after_beyond_age`; an unreadable value falls back to the queue's backoff.

The queue's backoff is far below a second, so every delay asserted here is the target's."""

from __future__ import annotations

import time
from email.utils import formatdate
from typing import Any

import asyncpg
from aiohttp import web

from tests.harness import (
    Target,
    job_changes,
    make_settings,
    running_daemon,
    serve_target,
)

DAY_S = 86_400
WEEK_S = 7 * DAY_S
QUEUE = {"backoff_base_s": 0.01, "backoff_cap_s": 0.05, "max_attempts": 5}


def answers(headers_by_key: dict[str, tuple[int, dict[str, str]]]) -> Target:
    """A target answering each job (by its key) with a fixed status and headers on its first
    request, and 200 on any later one."""

    async def respond(request: web.Request, count: int) -> web.StreamResponse:
        status, headers = headers_by_key[request.headers["Idempotency-Key"]]
        if count > 1:
            return web.json_response({"ok": True})
        return web.Response(status=status, text="come back later", headers=headers)

    return Target(respond=respond)


async def settle(db_url: str, keys: list[str]) -> dict[str, dict[str, Any]]:
    """Each job once its first attempt has ended: its state, due time and that attempt."""
    rows: dict[str, dict[str, Any]] = {}

    async def ended(conn: asyncpg.Connection) -> bool:
        found = await conn.fetch(
            """SELECT j.key, j.state, j.dead_reason, j.due_at, a.finished_at, a.outcome,
                      a.reason, a.http_status
                 FROM dispatcher.jobs j
                 JOIN dispatcher.attempt_history a ON a.job_id = j.id AND a.attempt = 1
                WHERE j.key = ANY ($1::text[])""",
            keys,
        )
        rows.update({r["key"]: dict(r) for r in found})
        return len(rows) == len(keys)

    async with job_changes(db_url) as jobs:
        await jobs.until(ended, timeout_s=20, what=f"the first attempts of {keys}")
    return rows


async def test_retry_after_is_honoured_past_a_day_in_both_forms_on_429_503_5xx_and_3xx(
    db_url: str,
) -> None:
    in_two_days = int(time.time()) + 2 * DAY_S
    cases = {
        # key: (status, headers, the delay the job must wait in seconds, or the due instant)
        "429-seconds": (429, {"Retry-After": str(2 * DAY_S)}, 2 * DAY_S),
        "503-seconds": (503, {"Retry-After": "7200"}, 7200),
        "503-date": (503, {"Retry-After": formatdate(in_two_days, usegmt=True)}, None),
        "500-seconds": (500, {"Retry-After": "3600"}, 3600),
        "502-date": (502, {"Retry-After": formatdate(in_two_days, usegmt=True)}, None),
        "307-seconds": (307, {"Retry-After": "600", "Location": "/maintenance"}, 600),
    }
    target = answers({k: (status, headers) for k, (status, headers, _) in cases.items()})
    settings = make_settings(db_url, queues={"default": {**QUEUE, "max_retry_age_s": WEEK_S}})
    conn = await asyncpg.connect(db_url)
    try:
        async with serve_target(target), running_daemon(settings) as d:
            for key in cases:
                await d.post_job(key, {"handler": "http", "target": {"url": target.url}})
            rows = await settle(db_url, list(cases))
    finally:
        await conn.close()
    for key, (status, _, delay_s) in cases.items():
        row = rows[key]
        assert (row["state"], row["outcome"], row["http_status"]) == (
            "scheduled",
            "retried",
            status,
        ), (key, row)
        if delay_s is not None:
            # due_at and the attempt's end come from one statement's now(): exact
            waited = (row["due_at"] - row["finished_at"]).total_seconds()
            assert waited == delay_s, (key, waited)
        else:
            assert abs(row["due_at"].timestamp() - in_two_days) <= 1, (key, row["due_at"])
    assert rows["429-seconds"]["reason"] == "rate_limited"
    assert rows["500-seconds"]["reason"] == "transient"


async def test_retry_after_beyond_the_retry_age_is_dead_and_a_bad_value_is_the_backoff(
    db_url: str,
) -> None:
    cases = {
        "two-days": (429, {"Retry-After": str(2 * DAY_S)}),  # past the 1-day retry age
        "huge": (503, {"Retry-After": "9" * 400}),  # infinite as a float: clamped, still past
        "far-date": (503, {"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}),
        "unreadable": (429, {"Retry-After": "in a while"}),  # ignored: backoff, then 200
        "negative": (503, {"Retry-After": "-30"}),  # at least 0: backoff, then 200
        "redirect": (302, {"Location": "/elsewhere"}),  # no Retry-After: refused as before
    }
    settings = make_settings(db_url, queues={"default": {**QUEUE, "max_retry_age_s": DAY_S}})
    target = answers(cases)
    conn = await asyncpg.connect(db_url)
    try:
        async with serve_target(target), running_daemon(settings) as d:
            for key in cases:
                await d.post_job(key, {"handler": "http", "target": {"url": target.url}})

            async def finished(c: asyncpg.Connection) -> bool:
                n = await c.fetchval(
                    "SELECT count(*) FROM dispatcher.jobs WHERE state IN ('dead', 'succeeded')"
                )
                return bool(n == len(cases))

            async with job_changes(db_url) as jobs:
                await jobs.until(finished, timeout_s=20, what="every job dead or succeeded")
        rows = {
            r["key"]: dict(r)
            for r in await conn.fetch(
                "SELECT key, state, dead_reason, attempt, last_error FROM dispatcher.jobs"
            )
        }
    finally:
        await conn.close()
    assert {k: (r["state"], r["dead_reason"], r["attempt"]) for k, r in rows.items()} == {
        "two-days": ("dead", "retry_after_beyond_age", 1),
        "huge": ("dead", "retry_after_beyond_age", 1),
        "far-date": ("dead", "retry_after_beyond_age", 1),
        "unreadable": ("succeeded", None, 2),
        "negative": ("succeeded", None, 2),
        "redirect": ("dead", "http_3xx", 1),
    }
    assert rows["two-days"]["last_error"] == "HTTP 429: come back later"
