"""Reschedule and run-now on a real daemon, through the API and the CLI: a scheduled job run now
starts at once; a ready job moved to later waits as `scheduled` (no outbox row in process); the
idempotency fingerprint is untouched; running and terminal jobs are refused with their state;
due times outside intake's range (or long past) are refused and change nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from tests.harness import (
    InProcessDaemon,
    Target,
    cli,
    make_settings,
    running_daemon,
    serve_target,
)

FAR = "2031-05-31T00:00:00Z"


async def reschedule(d: InProcessDaemon, job_id: int, due_at: Any) -> tuple[int, Any]:
    path = f"{d.base_url}/v1/jobs/{job_id}/reschedule"
    async with d.session.post(path, json={"due_at": due_at}) as r:
        return r.status, await r.json(content_type=None)


async def outbox_rows(conn: asyncpg.Connection, job_id: int) -> int:
    return await conn.fetchval(  # type: ignore[no-any-return]
        "SELECT count(*) FROM dispatcher.outbox WHERE job_id = $1", job_id
    )


async def test_run_now_postpone_and_the_fingerprint(db_url: str, tmp_path: Path) -> None:
    settings = make_settings(db_url, queues={"default": {}, "held": {}})
    conn = await asyncpg.connect(db_url)
    async with serve_target(Target()) as target, running_daemon(settings) as d:
        body = {"handler": "http", "target": {"url": target.url}, "due_at": FAR, "payload": {}}
        job = await d.post_job("run-me-now", body)
        original = await conn.fetchval(
            "SELECT request_hash FROM dispatcher.jobs WHERE id = $1", job["id"]
        )

        status, view = await reschedule(d, job["id"], "now")
        assert (status, view["state"]) == (200, "ready"), view
        await target.wait_for(lambda t: "run-me-now" in t.request_keys(), what="the job to run")
        assert (await d.get_job(job["id"]))["attempt"] == 1

        # the key still names the same request: the original POST replays, a new body conflicts
        async with d.session.post(
            f"{d.base_url}/v1/jobs", json=body, headers={"Idempotency-Key": "run-me-now"}
        ) as r:
            assert (r.status, r.headers.get("Idempotent-Replayed")) == (202, "true")
        async with d.session.post(
            f"{d.base_url}/v1/jobs",
            json={**body, "due_at": None},
            headers={"Idempotency-Key": "run-me-now"},
        ) as r:
            assert r.status == 409
        assert (
            await conn.fetchval("SELECT request_hash FROM dispatcher.jobs WHERE id = $1", job["id"])
            == original
        )

        # a ready job moved later goes back to scheduled (in process it never had an outbox
        # row: migration 015); its retry
        # age now counts from the new due time (it never started)
        await conn.execute(
            "UPDATE dispatcher.queues SET paused = true, paused_at = now() WHERE name = 'held'"
        )
        held = await d.post_job("held", {**body, "queue": "held", "due_at": None})
        assert held["state"] == "ready"
        assert await outbox_rows(conn, held["id"]) == 0
        later = (datetime.now(UTC) + timedelta(days=3)).replace(microsecond=0)
        status, view = await reschedule(d, held["id"], later.isoformat())
        assert (status, view["state"]) == (200, "scheduled"), view
        assert datetime.fromisoformat(view["due_at"]) == later
        assert await outbox_rows(conn, held["id"]) == 0
        budget = await conn.fetchval(
            "SELECT budget_started_at FROM dispatcher.jobs WHERE id = $1", held["id"]
        )
        assert budget == later

        # back to now with the CLI: ready (no outbox row in process), and it runs once resumed
        moved = await cli(
            "jobs",
            "reschedule",
            str(held["id"]),
            "--at",
            "now",
            "--json",
            cwd=tmp_path,
            env={"DISPATCHER_DATABASE_URL": db_url},
        )
        assert moved.code == 0, moved.stderr
        assert '"state": "ready"' in moved.stdout
        assert await outbox_rows(conn, held["id"]) == 0
        await conn.execute(
            "UPDATE dispatcher.queues SET paused = false, paused_at = NULL WHERE name = 'held'"
        )
        await conn.execute("NOTIFY dispatcher_wake, 'ready'")
        await target.wait_for(lambda t: "held" in t.request_keys(), what="the held job to run")
        assert target.request_keys().count("held") == 1

        # a scheduled job moved to another future time stays scheduled, and waits
        other = await d.post_job("other", body)
        status, view = await reschedule(d, other["id"], "2032-01-01T12:00:00+02:00")
        assert (status, view["state"], view["due_at"]) == (
            200,
            "scheduled",
            "2032-01-01T10:00:00Z",  # as rfc3339.format writes every time
        )
        assert await outbox_rows(conn, other["id"]) == 0
    await conn.close()


async def test_only_waiting_jobs_move_and_bad_times_change_nothing(
    db_url: str, tmp_path: Path
) -> None:
    settings = make_settings(db_url)
    env = {"DISPATCHER_DATABASE_URL": db_url}
    conn = await asyncpg.connect(db_url)
    async with running_daemon(settings) as d:
        job = await d.post_job(
            "waiting", {"handler": "http", "target": {"url": "https://x.example/"}, "due_at": FAR}
        )
        for due_at, detail in (
            (
                "1999-12-31T23:59:59Z",
                "due_at: is out of range; due times run from "
                "2000-01-01T00:00:00Z through 9999-12-31T23:59:59Z",
            ),
            ("9999-12-31T23:59:59-01:00", "due_at: is out of range"),
            ("2020-01-01T00:00:00Z", 'is more than 300 s in the past; send "now"'),
            ("tomorrow", "due_at: must be an RFC 3339 timestamp with offset"),
            ("2031-05-31T00:00:00", "due_at: must be an RFC 3339 timestamp with offset"),
            ("2031-02-30T00:00:00Z", "due_at: '2031-02-30T00:00:00Z' is no such date or time"),
            (None, 'due_at: send "now" or an RFC 3339 timestamp'),
            (5, "due_at: must be an RFC 3339 timestamp"),
        ):
            status, doc = await reschedule(d, job["id"], due_at)
            assert (status, detail in doc["detail"]) == (422, True), (due_at, doc)
        async with d.session.post(f"{d.base_url}/v1/jobs/{job['id']}/reschedule", json=[]) as r:
            assert r.status == 422
        async with d.session.post(
            f"{d.base_url}/v1/jobs/{job['id']}/reschedule", json={"due_at": "now", "x": 1}
        ) as r:
            assert r.status == 422
        assert (await d.get_job(job["id"]))["due_at"] == "2031-05-31T00:00:00Z"
        assert (await reschedule(d, 424242, "now"))[0] == 404
        assert (await reschedule(d, "abc", "now"))[0] == 404  # type: ignore[arg-type]

        for state in ("running", "succeeded", "dead", "cancelled", "discarded"):
            await conn.execute(
                "UPDATE dispatcher.jobs SET state = $2, lease_owner = CASE WHEN $2 = 'running'"
                " THEN 'w:1' END, lease_expires_at = CASE WHEN $2 = 'running'"
                " THEN now() + interval '1 hour' END, finished_at = CASE WHEN $2 <> 'running'"
                " THEN now() END WHERE id = $1",
                job["id"],
                state,
            )
            status, doc = await reschedule(d, job["id"], "now")
            assert (status, doc["state"]) == (409, state)
            refusal = f"job {job['id']} is {state}; only scheduled or ready jobs can be rescheduled"
            assert doc["detail"] == refusal
            refused = await cli(
                "jobs", "reschedule", str(job["id"]), "--at", "now", cwd=tmp_path, env=env
            )
            # the same refusal at both doors (the operator service's words)
            assert (refused.code, refused.stderr.splitlines()[-1]) == (1, f"dispatcher: {refusal}")
            assert (await d.get_job(job["id"]))["state"] == state

    bad = await cli("jobs", "reschedule", "1", "--at", "soon", cwd=tmp_path, env=env)
    assert (bad.code, bad.stderr.strip()) == (
        2,
        "dispatcher: --at: must be an RFC 3339 timestamp with offset, e.g. 2026-05-31T00:00:00Z",
    )
    past = await cli(
        "jobs", "reschedule", "1", "--at", "2020-01-01T00:00:00Z", cwd=tmp_path, env=env
    )
    assert past.code == 2 and 'send "now" to run it now' in past.stderr
    await conn.close()
