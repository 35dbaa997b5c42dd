"""SIGKILL in the crash windows of issue 11's cron items, on real daemons:

- between the pages of a cursor-paged sql handler: the restarted daemon resumes after the last
  committed cursor and applies each remaining row once (none twice, none skipped);
- between marking a run finished and enqueueing its on_finished follow-up (same transaction):
  two daemons then race to finish the run, and exactly one follow-up exists and runs once.
"""

from __future__ import annotations

import json
import signal
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import asyncpg

from dispatcher.core.rfc3339 import format as rfc3339
from dispatcher.cron.expression import parse_cron
from tests.faults.common import (
    create_effects_table,
    daemon_env,
    effects_per_key,
    fetch,
    fetchval,
    post_batch,
    states,
)
from tests.harness import until_job_states, wait_until
from tests.harness.fixtures import Spawn

EXAMPLE = (
    Path(__file__).resolve().parents[2] / "config" / "examples" / "session-cleanup-cursor.toml"
)


async def execute(db_url: str, sql: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def trigger(base_url: str, schedule: str, period: datetime) -> dict[str, object]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            f"{base_url}/v1/schedules/{schedule}/trigger",
            json={"period_start": rfc3339(period)},
        ) as r,
    ):
        assert r.status == 202, await r.text()
        return await r.json()  # type: ignore[no-any-return]


# cursor pages -------------------------------------------------------------------------------
async def test_sigkill_between_cursor_pages_resumes_after_the_last_committed_cursor(
    db_url: str, spawn: Spawn
) -> None:
    period = parse_cron("30 3 * * *", "Europe/Berlin").latest_at_or_before(datetime.now(UTC))
    assert period is not None
    await execute(
        db_url,
        """
        CREATE SCHEMA app;
        CREATE TABLE app.sessions (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, tenant text NOT NULL,
            user_id bigint NOT NULL, expires_at timestamptz NOT NULL);
        CREATE INDEX sessions_tenant_id ON app.sessions (tenant, id);
        -- every delete, with the transaction that made it: a row deleted twice is impossible
        -- to miss, and the pages after the crash are told apart from the one before it
        CREATE TABLE app.deleted (id bigint PRIMARY KEY, tenant text, tx bigint);
        CREATE FUNCTION app.audit() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO app.deleted VALUES (OLD.id, OLD.tenant, txid_current());
            RETURN OLD;
        END $$;
        CREATE TRIGGER audit AFTER DELETE ON app.sessions
            FOR EACH ROW EXECUTE FUNCTION app.audit();
        """,
    )
    # 4 listed tenants, 450 sessions each, interleaved; 2 of 3 expired before the period
    await fetch(
        db_url,
        "INSERT INTO app.sessions (tenant, user_id, expires_at) "
        "SELECT t, g, $1::timestamptz + CASE WHEN g % 3 = 0 THEN interval '1 day' "
        "                                     ELSE interval '-1 day' END "
        "  FROM generate_series(1, 450) g, unnest($2::text[]) t ORDER BY g, t",
        period,
        ["acme", "globex", "initech", "umbrella"],
    )
    expired = {
        r["tenant"]: r["n"]
        for r in await fetch(
            db_url,
            "SELECT tenant, count(*) AS n FROM app.sessions WHERE expires_at < $1 GROUP BY 1",
            period,
        )
    }
    assert set(expired.values()) == {300}
    env = daemon_env(
        db_url,
        DISPATCHER_CONFIG=str(EXAMPLE),
        DISPATCHER_HANDLERS__EXPIRE_TENANT_SESSIONS__PAGE_SIZE="100",
        DISPATCHER_QUEUES__MAINTENANCE__MAX_INFLIGHT="1",  # one unit at a time: one crash page
    )
    crashing = await spawn({**env, "DISPATCHER_FAULT": "sql_after_page"})
    await trigger(crashing.base_url, "session-cleanup-cursor", period)
    assert await crashing.wait() == -signal.SIGKILL

    # exactly one page committed, with its progress: 100 rows of one tenant, up to the cursor
    (started,) = await fetch(
        db_url, "SELECT key, tenant, progress FROM dispatcher.jobs WHERE progress IS NOT NULL"
    )
    progress = json.loads(started["progress"])
    assert (progress["pages"], progress["rows"]) == (1, 100)
    first = await fetch(db_url, "SELECT id, tenant, tx FROM app.deleted")
    assert len(first) == 100 and {r["tenant"] for r in first} == {started["tenant"]}
    assert max(r["id"] for r in first) == progress["cursor"]

    restarted = await spawn(env)
    await until_job_states(db_url, {"succeeded": 4}, timeout_s=60)
    assert await restarted.stop() == 0

    # the resumed unit went on after its cursor: its later pages hold exactly the rest
    job = (
        await fetch(
            db_url, "SELECT attempt, result FROM dispatcher.jobs WHERE key = $1", started["key"]
        )
    )[0]
    result = json.loads(job["result"])
    assert job["attempt"] == 2
    assert (result["pages"], result["rows"]) == (4, 300)  # 1 before the crash + 3 after
    later = await fetch(
        db_url,
        "SELECT min(id) AS low, count(*) AS n FROM app.deleted WHERE tenant = $1 AND tx <> $2",
        started["tenant"],
        first[0]["tx"],
    )
    assert (later[0]["n"], later[0]["low"] > progress["cursor"]) == (200, True)
    # every expired session deleted once (app.deleted's key), every live one kept
    assert await fetchval(db_url, "SELECT count(*) FROM app.deleted") == 1200
    assert (
        await fetchval(db_url, "SELECT count(*) FROM app.sessions WHERE expires_at < $1", period)
        == 0
    )
    assert await fetchval(db_url, "SELECT count(*) FROM app.sessions") == 600


TOUCH_HANDLER = {
    "DISPATCHER_HANDLERS__TOUCH__KIND": "sql",
    "DISPATCHER_HANDLERS__TOUCH__CURSOR": "id",
    # the rows stay candidates after a page: only the cursor keeps a page from coming back
    "DISPATCHER_HANDLERS__TOUCH__STATEMENT": (
        "UPDATE fault_rows SET touched = touched + 1 WHERE id IN "
        "(SELECT id FROM fault_rows WHERE bucket = $1 AND id > coalesce($2::bigint, 0) "
        "ORDER BY id LIMIT $3) RETURNING id"
    ),
    "DISPATCHER_HANDLERS__TOUCH__PARAMS": "bucket,cursor,page_size",
    "DISPATCHER_HANDLERS__TOUCH__PAGE_SIZE": "100",
}


async def test_sigkill_between_cursor_pages_applies_no_page_twice(
    db_url: str, spawn: Spawn
) -> None:
    await fetch(
        db_url,
        "CREATE TABLE fault_rows (id bigserial PRIMARY KEY, bucket text, "
        "touched integer NOT NULL DEFAULT 0)",
    )
    await fetch(
        db_url,
        "INSERT INTO fault_rows (bucket) SELECT CASE WHEN g % 10 = 0 THEN 'other' ELSE 'mine' "
        "END FROM generate_series(1, 1150) g",
    )
    env = daemon_env(db_url, **TOUCH_HANDLER)
    crashing = await spawn({**env, "DISPATCHER_FAULT": "sql_after_page"})
    await post_batch(
        crashing.base_url,
        [{"idempotency_key": "touch-mine", "handler": "touch", "payload": {"bucket": "mine"}}],
    )
    assert await crashing.wait() == -signal.SIGKILL
    (job,) = await fetch(db_url, "SELECT state, progress FROM dispatcher.jobs")
    progress = json.loads(job["progress"])
    assert (job["state"], progress["pages"], progress["rows"]) == ("running", 1, 100)
    assert await fetchval(db_url, "SELECT count(*) FROM fault_rows WHERE touched > 0") == 100

    restarted = await spawn(env)
    await until_job_states(db_url, {"succeeded": 1}, timeout_s=30)
    assert await restarted.stop() == 0
    (job,) = await fetch(db_url, "SELECT attempt, result FROM dispatcher.jobs")
    # 1035 rows of 'mine': 1 page before the crash + 10 after (9 full, one of 35)
    assert job["attempt"] == 2
    result = json.loads(job["result"])
    assert (result["pages"], result["rows"]) == (11, 1035)
    touched = await fetch(
        db_url, "SELECT bucket, touched, count(*) AS n FROM fault_rows GROUP BY 1, 2 ORDER BY 1"
    )
    assert [(r["bucket"], r["touched"], r["n"]) for r in touched] == [
        ("mine", 1, 1035),
        ("other", 0, 115),
    ]


# run-finished follow-ups --------------------------------------------------------------------
FOLLOW_UP_CONFIG = """
[queues.default]

[handlers.record]
kind = "python"
function = "tests.faults.handlers:record_effect"

[[schedules]]
name = "join"
cron = "0 0 1 1 *"          # yearly: only the explicit trigger creates a run in this test
handler = "record"
fanout = { tenants = ["t1", "t2", "t3", "t4", "t5"] }
on_finished = { handler = "record", payload = { note = "all units done" } }
"""


async def test_sigkill_between_finishing_a_run_and_its_follow_up_yields_one_follow_up(
    db_url: str, spawn: Spawn, tmp_path: Path
) -> None:
    await create_effects_table(db_url)
    config = tmp_path / "join.toml"
    config.write_text(FOLLOW_UP_CONFIG)
    env = daemon_env(db_url, DISPATCHER_CONFIG=str(config))
    period = parse_cron("0 0 1 1 *").latest_at_or_before(datetime.now(UTC))
    assert period is not None
    run = f"join:{rfc3339(period)}"

    crashing = await spawn({**env, "DISPATCHER_FAULT": "run_finished_before_follow_up"})
    await trigger(crashing.base_url, "join", period)
    # the five units run; the sweep that finds the run finished dies inside its transaction
    assert await crashing.wait() == -signal.SIGKILL
    assert await effects_per_key(db_url) == {f"{run}:t{i}": 1 for i in range(1, 6)}
    assert (
        await fetchval(db_url, "SELECT finished_at FROM dispatcher.runs WHERE run_key = $1", run)
        is None
    )  # rolled back together with the follow-up it never wrote
    assert await states(db_url) == {"succeeded": 5}

    # two daemons now sweep the same run, concurrently, every second
    first, second = await spawn(env), await spawn(env)
    follow_up = f"{run}:finished"
    await wait_until(lambda: _succeeded(db_url, follow_up), timeout_s=30, what="the follow-up ran")
    # a few more sweeps of both daemons find nothing more to do
    await wait_until(lambda: _swept_since(db_url, follow_up), timeout_s=10, what="later sweeps")
    assert await first.stop() == 0 and await second.stop() == 0

    assert await states(db_url) == {"succeeded": 6}
    effects = await effects_per_key(db_url)
    assert effects[follow_up] == 1 and sum(effects.values()) == 6
    (job,) = await fetch(
        db_url, "SELECT payload, run_key FROM dispatcher.jobs WHERE key = $1", follow_up
    )
    assert job["run_key"] is None
    assert json.loads(job["payload"]) == {
        "note": "all units done",
        "schedule": "join",
        "period_start": rfc3339(period),
        "run_key": run,
        "units": 5,
        "succeeded": 5,
        "dead": 0,
        "discarded": 0,
        "cancelled": 0,
    }
    (receipt,) = await fetch(
        db_url, "SELECT succeeded, finished_at FROM dispatcher.runs WHERE run_key = $1", run
    )
    assert receipt["succeeded"] == 5 and receipt["finished_at"] is not None


async def _succeeded(db_url: str, key: str) -> bool:
    state = await fetchval(db_url, "SELECT state FROM dispatcher.jobs WHERE key = $1", key)
    return state == "succeeded"


async def _swept_since(db_url: str, key: str) -> bool:
    """True once two seconds (two sweeps of each daemon) passed after the follow-up ended."""
    return bool(
        await fetchval(
            db_url,
            "SELECT now() - finished_at > interval '2 seconds' FROM dispatcher.jobs WHERE key = $1",
            key,
        )
    )
