"""What on-call sees: the metrics scrape after a mixed workload, and the JSON log lines."""

from __future__ import annotations

import json
import shutil
import subprocess

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import LOOPBACK_ENV, Target, job_changes, serve_target, wait_until
from tests.harness.fixtures import Spawn

SECRET = "whsec_" + "c2VjcmV0LXNpZ25pbmcta2V5LWZvci10ZXN0cw=="
TOKEN = "token-that-must-never-be-logged"


def sample(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


async def respond(request: web.Request, count: int) -> web.StreamResponse:
    kind = request.headers["Idempotency-Key"].split("-")[0]
    if kind == "dead":
        return web.Response(status=400, text="unknown grant")
    if kind == "retry" and count == 1:
        return web.Response(status=500)
    return web.json_response({"ok": True})


async def test_scrape_after_mixed_workload_and_json_logs(db_url: str, spawn: Spawn) -> None:
    async with serve_target(Target(respond=respond)) as target:
        daemon = await spawn(
            {
                "DISPATCHER_DATABASE_URL": db_url,
                **LOOPBACK_ENV,
                "DISPATCHER_QUEUES__DEFAULT__BACKOFF_BASE_S": "0.1",
                "DISPATCHER_HTTP__SIGNING_SECRET": SECRET,
                "DISPATCHER_API_TOKENS": TOKEN,
                "DISPATCHER_LOG_FORMAT": "json",
                "DISPATCHER_LOG_LEVEL": "DEBUG",
            }
        )
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession(headers=headers) as s:
            for key in ("ok-1", "ok-2", "retry-1", "dead-1"):
                body = {
                    "handler": "http",
                    "target": {"url": target.url},
                    "payload": {"marker": "payload-body-must-not-be-logged"},
                }
                async with s.post(
                    f"{daemon.base_url}/v1/jobs", json=body, headers={"Idempotency-Key": key}
                ) as r:
                    assert r.status == 202
            async with job_changes(db_url) as jobs:
                await jobs.until(
                    lambda c: c.fetchval(
                        "SELECT count(*) = 4 FROM dispatcher.jobs"
                        " WHERE state IN ('succeeded', 'dead')"
                    ),
                    what="the four jobs ended",
                )
            scrape = ""

            async def counted() -> bool:
                # the counters move after the outcome's commit, which the rows above show
                nonlocal scrape
                async with s.get(f"{daemon.base_url}/metrics") as r:
                    scrape = await r.text()
                return (
                    sum(
                        sample(scrape, "dispatcher_jobs_completed_total", outcome=o)
                        for o in ("succeeded", "dead")
                    )
                    >= 4
                )

            await wait_until(counted, timeout_s=10, what="the four outcomes counted")
        assert await daemon.stop() == 0

    assert sample(scrape, "dispatcher_jobs_accepted_total", queue="default") == 4
    assert sample(scrape, "dispatcher_jobs_completed_total", outcome="succeeded") == 3
    assert sample(scrape, "dispatcher_jobs_completed_total", outcome="dead") == 1
    assert sample(scrape, "dispatcher_retries_total", reason="transient") == 1
    assert sample(scrape, "dispatcher_dead_letters_total", reason="http_4xx") == 1
    assert sample(scrape, "dispatcher_due_to_start_seconds_count", queue="default") == 5
    assert sample(scrape, "dispatcher_http_responses_total", **{"class": "4xx"}) == 1
    assert sample(scrape, "dispatcher_build_info") == 1
    promtool = shutil.which("promtool")
    if promtool:  # CI installs it; the metric format check is the ecosystem's own
        check = subprocess.run(  # noqa: ASYNC221 - the daemon is stopped; nothing to block
            [promtool, "check", "metrics"], input=scrape.encode(), capture_output=True, timeout=30
        )
        assert check.returncode == 0, check.stdout + check.stderr

    lines = [json.loads(line) for line in daemon.log_text().splitlines() if line.strip()]
    assert all({"ts", "level", "message"} <= set(e) for e in lines)
    about_jobs = [e for e in lines if e.get("logger") == "dispatcher.job"]
    assert {e["job_key"] for e in about_jobs} >= {"retry-1", "dead-1"}
    assert all({"job_id", "job_key", "queue", "attempt"} <= set(e) for e in about_jobs)
    text = daemon.log_text()
    for secret in (TOKEN, SECRET, "payload-body-must-not-be-logged"):
        assert secret not in text


async def test_separate_metrics_listener_serves_only_health_and_metrics(
    db_url: str, spawn: Spawn
) -> None:
    from tests.harness import free_port

    port = free_port()
    daemon = await spawn(
        {
            "DISPATCHER_DATABASE_URL": db_url,
            "DISPATCHER_METRICS_LISTEN": f"127.0.0.1:{port}",
        }
    )
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{port}/metrics") as r:
            assert r.status == 200 and "dispatcher_build_info" in await r.text()
        async with s.get(f"http://127.0.0.1:{port}/readyz") as r:
            assert r.status == 200
        async with s.get(f"http://127.0.0.1:{port}/v1/jobs") as r:
            assert r.status == 404  # the API is not on this listener
    assert await daemon.stop() == 0
