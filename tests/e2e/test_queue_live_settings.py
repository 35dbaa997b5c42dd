"""Run windows and limits changed at run time, end to end on real daemon processes sharing one
database, on both transports: outside every window nothing is claimed while due jobs still
become ready, and claims begin within a second of the opening; a change made through one
daemon's API or the CLI holds on every daemon within a second, and a reset undoes it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from tests.harness import LOOPBACK_ENV, DaemonProcess, Target, cli, serve_target, wait_until
from tests.harness.fixtures import Spawn
from tests.transports import transport, transport_env  # noqa: F401 (fixtures)

QUEUE = "default"


def daemon_env(db_url: str, broker: dict[str, str], **queue: str) -> dict[str, str]:
    return {
        "DISPATCHER_DATABASE_URL": db_url,
        **LOOPBACK_ENV,
        **broker,
        "DISPATCHER_DRAIN_TIMEOUT_S": "10",
        **{f"DISPATCHER_QUEUES__{QUEUE.upper()}__{k.upper()}": v for k, v in queue.items()},
    }


async def start(spawn: Spawn, env: dict[str, str], n: int) -> list[DaemonProcess]:
    return list(await asyncio.gather(*(spawn(env) for _ in range(n))))


async def call(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.request(method, url, json=body) as r:
        return r.status, await r.json(content_type=None)


async def enqueue(daemon: DaemonProcess, n: int, url: str, prefix: str, **fields: Any) -> None:
    items = [
        {"idempotency_key": f"{prefix}-{i}", "handler": "http", "target": {"url": url}, **fields}
        for i in range(n)
    ]
    status, doc = await call("POST", f"{daemon.base_url}/v1/jobs/batch", {"jobs": items})
    assert status in (200, 207), doc


async def counts(conn: asyncpg.Connection) -> dict[str, int]:
    rows = await conn.fetch("SELECT state, count(*)::int AS n FROM dispatcher.jobs GROUP BY 1")
    return {r["state"]: r["n"] for r in rows}


def window_from(start: datetime, seconds: int) -> str:
    end = start + timedelta(seconds=seconds)
    return f"daily {start:%H:%M:%S}-{end:%H:%M:%S} UTC"


async def metric(daemon: DaemonProcess, line_start: str) -> str | None:
    async with aiohttp.ClientSession() as s, s.get(f"{daemon.base_url}/metrics") as r:
        text = await r.text()
    return next((ln.split()[-1] for ln in text.splitlines() if ln.startswith(line_start)), None)


async def test_nothing_is_claimed_outside_the_window_and_claims_begin_as_it_opens(
    db_url: str,
    transport_env: dict[str, str],  # noqa: F811
    spawn: Spawn,
) -> None:
    # the file's window opens in two hours: closed while the daemons start and work falls due
    later = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    env = daemon_env(db_url, transport_env, windows=window_from(later, 60))
    conn = await asyncpg.connect(db_url)
    async with serve_target(Target()) as target:
        a, b = await start(spawn, env, 2)
        soon = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
        await enqueue(a, 20, target.url, "now")
        await enqueue(b, 10, target.url, "soon", due_at=soon)
        # due jobs become ready (the backlog is visible); none starts while closed
        await wait_until(lambda: _ready_is(conn, 30), timeout_s=10, what="30 ready, none claimed")
        status, listing = await call("GET", f"{a.base_url}/v1/queues")
        (view,) = [q for q in listing["queues"] if q["name"] == QUEUE]
        assert view["window_open"] is False
        assert view["window_opens_at"] == later.isoformat().replace("+00:00", "Z")
        assert view["settings"]["windows"]["source"] == "file"
        assert await metric(a, f'dispatcher_queue_window_open{{queue="{QUEUE}"}}') == "0.0"
        await _ready_is(conn, 30)

        # a window that opens three seconds from now (a run-time change, on every daemon)
        opens = (datetime.now(UTC) + timedelta(seconds=3)).replace(microsecond=0)
        status, view = await call(
            "PATCH", f"{b.base_url}/v1/queues/{QUEUE}", {"windows": [window_from(opens, 3600)]}
        )
        assert status == 200, view
        assert view["window_open"] is False
        assert view["window_opens_at"] == opens.isoformat().replace("+00:00", "Z")
        await wait_until(lambda: len(target.requests) == 30, timeout_s=30, what="all 30 delivered")
        first = await conn.fetchval("SELECT min(started_at) FROM dispatcher.jobs")
        assert first >= opens, f"a job started at {first}, before the window opened at {opens}"
        assert first <= opens + timedelta(seconds=1.5), f"first start {first}, opening {opens}"

        async def gauge_open() -> bool:  # the gauge follows within a second
            return await metric(b, f'dispatcher_queue_window_open{{queue="{QUEUE}"}}') == "1.0"

        await wait_until(gauge_open, timeout_s=3, what="dispatcher_queue_window_open 1")
    await conn.close()


async def _ready_is(conn: asyncpg.Connection, n: int) -> bool:
    now = await counts(conn)
    assert now.get("running", 0) + now.get("succeeded", 0) == 0, f"claimed while closed: {now}"
    return now.get("ready", 0) == n


async def test_a_window_closed_at_run_time_stops_every_daemon_within_a_second(
    db_url: str,
    transport_env: dict[str, str],  # noqa: F811
    spawn: Spawn,
) -> None:
    env = daemon_env(db_url, transport_env, max_inflight="2", claim_batch="2")
    conn = await asyncpg.connect(db_url)
    async with serve_target(Target(delay_s=0.2)) as target:
        a, b = await start(spawn, env, 2)
        await enqueue(a, 200, target.url, "w")
        await wait_until(lambda: len(target.requests) >= 4, what="work under way")
        closed = window_from(datetime.now(UTC) + timedelta(hours=2), 60)
        status, view = await call("PATCH", f"{b.base_url}/v1/queues/{QUEUE}", {"windows": [closed]})
        assert status == 200, view
        assert view["window_open"] is False and view["settings"]["windows"]["source"] == "override"
        changed = await conn.fetchval("SELECT clock_timestamp()")
        await wait_until(
            lambda: _none_running(conn), timeout_s=10, what="running attempts to finish"
        )
        last = await conn.fetchval("SELECT max(started_at) FROM dispatcher.jobs")
        assert last <= changed + timedelta(seconds=1.2), f"started {last}, closed at {changed}"
        held = len(target.requests)
        # reset (the CLI, straight on the database): the file's windows (none) hold again
        result = await cli("queues", "reset", QUEUE, cwd=Path.cwd(), env=env)
        assert result.code == 0, result.stderr
        assert "window             open" in result.stdout
        await wait_until(lambda: len(target.requests) > held + 4, timeout_s=5, what="claims again")
    await conn.close()


async def _none_running(conn: asyncpg.Connection) -> bool:
    return (await counts(conn)).get("running", 0) == 0


async def starts_between(conn: asyncpg.Connection, since: datetime, until: datetime) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM dispatcher.jobs WHERE started_at >= $1 AND started_at < $2",
            since,
            until,
        )
    )


async def test_limits_changed_at_run_time_hold_on_every_daemon(
    db_url: str,
    transport_env: dict[str, str],  # noqa: F811
    spawn: Spawn,
) -> None:
    # the file: 2 starts a second; raised at run time to 20, then the in-flight cap lowered
    env = daemon_env(db_url, transport_env, rate_per_s="2", burst="1", max_inflight="50")
    conn = await asyncpg.connect(db_url)
    async with serve_target(Target(delay_s=0.3)) as target:
        a, b = await start(spawn, env, 2)
        await enqueue(a, 400, target.url, "r")
        await wait_until(lambda: len(target.requests) >= 2, what="work under way")

        result = await cli(
            "queues", "set", QUEUE, "--rate-per-s", "20", "--burst", "2", cwd=Path.cwd(), env=env
        )
        assert result.code == 0, result.stderr
        assert "rate_per_s         20.0  [override] (file: 2.0)" in result.stdout
        changed = await conn.fetchval("SELECT clock_timestamp()")
        await wait_until(
            lambda: _started_since(conn, changed, 3),
            timeout_s=1 / 20 + 1 + 0.5,
            what="starts at the new rate within 1/rate + 1 s",
        )
        window_start = changed + timedelta(seconds=1)
        await wait_until(
            lambda: _db_past(conn, window_start + timedelta(seconds=3)), timeout_s=10, what="3 s"
        )
        n = await starts_between(conn, window_start, window_start + timedelta(seconds=3))
        assert 40 <= n <= 20 * 3 + 2, f"{n} starts in 3 s at 20/s (the file's rate gives 6)"

        # lowered at run time through the other daemon's API: at most 2 in flight at once
        status, view = await call(
            "PATCH", f"{b.base_url}/v1/queues/{QUEUE}", {"max_inflight": 2, "rate_per_s": 100}
        )
        assert status == 200, view
        assert view["settings"]["max_inflight"] == {"value": 2, "source": "override", "file": 50}
        await wait_until(lambda: _running_at_most(conn, 2), timeout_s=3, what="in flight <= 2")
        held_until = datetime.now(UTC) + timedelta(seconds=1.5)
        while datetime.now(UTC) < held_until:  # and it stays there while work waits
            assert (await counts(conn)).get("running", 0) <= 2
        assert (await counts(conn)).get("ready", 0) > 0
        reset = await cli("queues", "reset", QUEUE, "--json", cwd=Path.cwd(), env=env)
        assert reset.code == 0, reset.stderr
        assert '"source": "override"' not in reset.stdout
    await conn.close()


async def _started_since(conn: asyncpg.Connection, since: datetime, n: int) -> bool:
    found = await conn.fetchval(
        "SELECT count(*) FROM dispatcher.jobs WHERE started_at >= $1", since
    )
    return int(found) >= n


async def _db_past(conn: asyncpg.Connection, instant: datetime) -> bool:
    return bool(await conn.fetchval("SELECT clock_timestamp() >= $1", instant))


async def _running_at_most(conn: asyncpg.Connection, n: int) -> bool:
    return (await counts(conn)).get("running", 0) <= n


async def test_a_change_made_while_paused_holds_from_the_resume(
    db_url: str,
    transport_env: dict[str, str],  # noqa: F811
    spawn: Spawn,
) -> None:
    env = daemon_env(db_url, transport_env, rate_per_s="1", burst="1", max_inflight="10")
    conn = await asyncpg.connect(db_url)
    async with serve_target(Target(delay_s=0.3)) as target:
        a, b = await start(spawn, env, 2)
        await enqueue(a, 300, target.url, "p")
        await wait_until(lambda: len(target.requests) >= 1, what="work under way")
        status, _ = await call("POST", f"{a.base_url}/v1/queues/{QUEUE}/pause")
        assert status == 200
        status, view = await call(
            "PATCH",
            f"{b.base_url}/v1/queues/{QUEUE}",
            {"rate_per_s": 10, "burst": 2, "max_inflight": 3},
        )
        assert status == 200, view
        await wait_until(lambda: _none_running(conn), timeout_s=10, what="paused: none running")
        status, _ = await call("POST", f"{b.base_url}/v1/queues/{QUEUE}/resume")
        assert status == 200
        resumed = await conn.fetchval("SELECT clock_timestamp()")
        await wait_until(
            lambda: _started_since(conn, resumed, 1),
            timeout_s=1 / 10 + 1,
            what="a start within 1/rate + 1 s of the resume",
        )
        held_until = datetime.now(UTC) + timedelta(seconds=3)
        while datetime.now(UTC) < held_until:  # the new cap holds at once
            assert (await counts(conn)).get("running", 0) <= 3
        n = await starts_between(conn, resumed, resumed + timedelta(seconds=3))
        assert 15 <= n <= 10 * 3 + 2, f"{n} starts in 3 s at 10/s, 3 in flight (file: 1/s)"
    await conn.close()


async def test_a_raised_inflight_cap_is_used_on_both_transports(
    db_url: str,
    transport_env: dict[str, str],  # noqa: F811
    spawn: Spawn,
) -> None:
    # RabbitMQ: the broker's prefetch follows the cap (it was the file's, 2, since the start)
    env = daemon_env(db_url, transport_env, max_inflight="2")
    async with serve_target(Target(delay_s=0.5)) as target:
        (a,) = await start(spawn, env, 1)
        await enqueue(a, 200, target.url, "c")
        await wait_until(lambda: target.inflight == 2, what="2 in flight, the file's cap")
        assert target.max_inflight == 2
        status, view = await call("PATCH", f"{a.base_url}/v1/queues/{QUEUE}", {"max_inflight": 8})
        assert status == 200, view
        await wait_until(lambda: target.inflight >= 7, timeout_s=5, what="8 in flight")
        assert target.max_inflight <= 8


async def test_the_cli_refuses_bad_input_naming_the_option_and_changes_nothing(
    db_url: str, tmp_path: Path
) -> None:
    env = {"DISPATCHER_DATABASE_URL": db_url}
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(
            "INSERT INTO dispatcher.queues (name, max_attempts, max_retry_age_s) "
            "VALUES ('default', 3, 60) ON CONFLICT DO NOTHING"
        )
        for args, code, words in (
            (["--burst", "0"], 2, "--burst: Input should be greater than or equal to 1"),
            (["--window", "Mon-Fry 18:00-07:00"], 2, "--window: window 'Mon-Fry"),
            (["--key-burst", "3"], 2, "--key-burst: key_burst is the burst of key_rate_per_s"),
            (["--burst", "x"], 2, "--burst: invalid int value"),
        ):
            result = await cli("queues", "set", QUEUE, *args, cwd=tmp_path, env=env)
            assert result.code == code and words in result.stderr, (args, result.stderr)
        result = await cli("queues", "set", "nope", "--burst", "3", cwd=tmp_path, env=env)
        assert result.code == 1 and "no queue 'nope'; queues: default" in result.stderr
        assert await conn.fetchval("SELECT overrides FROM dispatcher.queues") in ("{}", {})
    finally:
        await conn.close()
