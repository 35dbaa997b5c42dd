"""Jobs due in the far future (years 2100 and 9999) are accepted and wait; they do not break the
due-scan's timer, so jobs due now, and soon, still start on time."""

from __future__ import annotations

import time

from tests.faults.common import create_effects_table, daemon_env, fetch, post_job
from tests.harness import job_changes
from tests.harness.fixtures import Spawn


async def test_far_future_jobs_wait_and_do_not_break_the_scan_timer(
    db_url: str, spawn: Spawn
) -> None:
    await create_effects_table(db_url)
    # a long scan interval: a job due in 1.5 s only starts on time if the timer is right
    env = daemon_env(db_url, DISPATCHER_SCAN_INTERVAL_S="30")
    daemon = await spawn(env)
    for key, due in (("year-2100", "2100-01-01T00:00:00Z"), ("year-9999", "9999-12-31T23:59:59Z")):
        accepted = await post_job(daemon.base_url, key, {"handler": "record", "due_at": due})
        assert accepted["state"] == "scheduled", accepted

    async with job_changes(db_url) as jobs:
        posted = time.monotonic()
        await post_job(daemon.base_url, "due-now", {"handler": "record"})
        await jobs.until_keys({"due-now": "succeeded"}, timeout_s=5)
        now_latency = time.monotonic() - posted

        soon = await fetch(db_url, "SELECT now() + interval '1.5 seconds' AS due")
        due = soon[0]["due"].isoformat()
        await post_job(daemon.base_url, "due-soon", {"handler": "record", "due_at": due})
        await jobs.until_keys({"due-soon": "succeeded"}, timeout_s=10)
    assert await daemon.stop() == 0

    rows = {
        r["key"]: r
        for r in await fetch(
            db_url,
            "SELECT key, state, attempt, extract(epoch FROM started_at - due_at) AS late_s, "
            "(SELECT count(*) FROM dispatcher.outbox o WHERE o.job_id = j.id) AS outbox "
            "FROM dispatcher.jobs j",
        )
    }
    print(
        f"\ndue now: succeeded {now_latency:.3f} s after POST; "
        f"due soon: started {float(rows['due-soon']['late_s']):.3f} s after its due time"
    )
    assert now_latency < 2.0
    assert 0 <= float(rows["due-soon"]["late_s"]) < 1.0  # not early, and not at the 30 s scan
    for key in ("year-2100", "year-9999"):
        assert (rows[key]["state"], rows[key]["attempt"], rows[key]["outbox"]) == (
            "scheduled",
            0,
            0,
        )
