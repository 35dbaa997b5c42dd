"""A failing job's attempts spread out as its queue's backoff says (full jitter, doubling up
to the cap), through a real daemon and a loopback target that always answers 500: the gap
between one attempt's end and the next one's start stays within the attempt's ceiling, grows
per attempt on average until the cap, and differs from job to job (no synchronised herd)."""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict

import asyncpg
from aiohttp import web

from tests.harness import Target, make_settings, running_daemon, serve_target, wait_until

JOBS = 30
BASE_S, CAP_S, ATTEMPTS = 0.5, 2.0, 6
# the due-scan moves a due job within milliseconds (it is armed for the next due time); the
# claim and the request add a little, and up to a second when the machine runs other tests
# beside this one (CI's parallel workers): the ceilings are wide enough to tell apart anyway
SLACK_S = 1.0


def ceiling(after_attempt: int) -> float:
    return float(min(CAP_S, BASE_S * 2 ** (after_attempt - 1)))


async def test_a_failing_jobs_attempts_spread_out_as_configured(db_url: str) -> None:
    async def always_500(request: web.Request, count: int) -> web.StreamResponse:
        return web.Response(status=500, text="down")

    queue = {"backoff_base_s": BASE_S, "backoff_cap_s": CAP_S, "max_attempts": ATTEMPTS}
    settings = make_settings(db_url, queues={"default": queue})
    target = Target(respond=always_500)
    conn = await asyncpg.connect(db_url)
    try:
        async with serve_target(target), running_daemon(settings) as d:
            for n in range(JOBS):
                await d.post_job(f"spread-{n}", {"handler": "http", "target": {"url": target.url}})

            async def all_dead() -> bool:
                dead = await conn.fetchval(
                    "SELECT count(*) FROM dispatcher.jobs WHERE state = 'dead'"
                )
                return bool(dead == JOBS)

            await wait_until(all_dead, timeout_s=120, what="every job dead after its attempts")
        rows = await conn.fetch(
            "SELECT job_id, attempt, started_at, finished_at FROM dispatcher.attempt_history "
            "ORDER BY job_id, attempt"
        )
    finally:
        await conn.close()
    by_job: dict[int, list[asyncpg.Record]] = defaultdict(list)
    for row in rows:
        by_job[row["job_id"]].append(row)
    gaps: dict[int, list[float]] = defaultdict(list)  # after attempt n: the wait before n+1
    for attempts in by_job.values():
        assert [a["attempt"] for a in attempts] == list(range(1, ATTEMPTS + 1))
        for before, after in itertools.pairwise(attempts):
            gap = (after["started_at"] - before["finished_at"]).total_seconds()
            assert 0 <= gap <= ceiling(before["attempt"]) + SLACK_S, (before["attempt"], gap)
            gaps[before["attempt"]].append(gap)
    means = {n: statistics.fmean(g) for n, g in gaps.items()}
    # uniform [0, c] has mean c/2: 0.25, 0.5, 1.0 s, then capped at 1.0 s
    assert means[1] < means[2] < means[3], means
    for n in (3, 4, 5):
        assert means[n] <= CAP_S / 2 + SLACK_S / 2, means
        assert means[n] > 0.2 * CAP_S, means
    for n in (3, 4, 5):  # jittered: the jobs' waits differ widely, not one herd
        assert statistics.pstdev(gaps[n]) > 0.15 * ceiling(n), (n, gaps[n])
