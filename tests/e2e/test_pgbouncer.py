"""The daemon behind a real PgBouncer 1.18 (the Debian package) in transaction mode, the way
Supavisor's transaction port or a managed PgBouncer serves it (docs/pooling.md): with
`database.wakeups = "poll"` HTTP jobs, SQL-door jobs and a sql handler (a prepared statement)
all run through it; in the default listen mode the daemon refuses to start, in one line that
names the fix, instead of waiting on a LISTEN that hears nothing."""

from __future__ import annotations

import json
from pathlib import Path

import asyncpg
import pytest

from tests.conftest import database_name
from tests.harness import (
    LOOPBACK_ENV,
    DaemonProcess,
    Target,
    cli,
    daemon_process,
    post,
    serve_target,
    stored_job,
    terminate,
    wait_until,
)
from tests.pgbouncer import pgbouncer

pytestmark = pytest.mark.timeout(180)

# what a session-mode PgBouncer must accept at connection start (or ignore)
SESSION_IGNORE = (
    "extra_float_digits,plan_cache_mode,jit,"
    "tcp_keepalives_idle,tcp_keepalives_interval,tcp_keepalives_count"
)
SQL_HANDLER_ENV = {
    "DISPATCHER_HANDLERS__PING__KIND": "sql",
    "DISPATCHER_HANDLERS__PING__STATEMENT": "SELECT 1 WHERE $1::int > 0",
    "DISPATCHER_HANDLERS__PING__PARAMS": "n",
}


async def test_poll_mode_runs_every_kind_of_job_through_a_transaction_pooler(
    server_url: str, db_url: str, tmp_path: Path
) -> None:
    async with (
        pgbouncer(server_url, database_name(db_url)) as pooled_url,
        serve_target(Target()) as target,
    ):
        env = {
            **LOOPBACK_ENV,
            **SQL_HANDLER_ENV,
            "DISPATCHER_DATABASE_URL": pooled_url,
            "DISPATCHER_DATABASE__WAKEUPS": "poll",
            "DISPATCHER_DATABASE__POLL_INTERVAL_S": "0.05",
        }
        async with daemon_process(env) as daemon:
            status, _ = await post(
                daemon, "over-http", {"handler": "http", "target": {"url": target.url}}
            )
            assert status == 202
            # the SQL door through the pooler too: its NOTIFY reaches no one; the poll finds it
            conn = await asyncpg.connect(pooled_url, statement_cache_size=0)
            try:
                await conn.execute(
                    "SELECT dispatcher.enqueue('sql-door', 'http', target => $1::jsonb)",
                    json.dumps({"url": target.url}),
                )
                await conn.execute("SELECT dispatcher.enqueue('prepared', 'ping', '{\"n\": 1}')")

                async def all_succeeded() -> bool:
                    rows = [
                        await stored_job(conn, key=k) for k in ("over-http", "sql-door", "prepared")
                    ]
                    return all(r is not None and r["state"] == "succeeded" for r in rows)

                await wait_until(all_succeeded, timeout_s=30, what="the three jobs to succeed")
            finally:
                await conn.close()
            assert sorted(target.request_keys()) == ["over-http", "sql-door"]
            # the commands too: no session settings, no named statements through the pooler
            listed = await cli("jobs", "list", "--key", "prepared", cwd=tmp_path, env=env)
            assert listed.code == 0 and "prepared" in listed.stdout, listed.stderr
            log = daemon.log_text()
            assert "no liveness lock" in log
            await terminate(daemon)
        assert "prepared statement" not in daemon.log_text()


async def test_listen_mode_behind_a_transaction_pooler_refuses_to_start_and_says_why(
    server_url: str, db_url: str, tmp_path: Path
) -> None:
    async with pgbouncer(server_url, database_name(db_url)) as pooled_url:
        daemon = DaemonProcess({**LOOPBACK_ENV, "DISPATCHER_DATABASE_URL": pooled_url})
        await daemon.start(wait_ready=False)
        assert await daemon.wait(timeout_s=60) == 1
        log = daemon.log_text()
        assert 'database.wakeups = "poll"' in log
        assert "DISPATCHER_DATABASE__WAKEUPS=poll" in log
        assert "Traceback" not in log
        # a command through the same URL: one line naming the fix, not a traceback
        env = {"DISPATCHER_DATABASE_URL": pooled_url}
        listed = await cli("jobs", "list", cwd=tmp_path, env=env)
        assert listed.code == 1
        assert "DISPATCHER_DATABASE__WAKEUPS=poll" in listed.stderr
        assert "Traceback" not in listed.stderr


async def test_session_mode_keeps_listen(server_url: str, db_url: str) -> None:
    """A session-mode pool keeps one server session per client: no refusal, LISTEN works. It
    must let the daemon's session settings through (docs/pooling.md)."""
    pooler = pgbouncer(server_url, database_name(db_url), mode="session", ignore=SESSION_IGNORE)
    env = {**LOOPBACK_ENV, "DISPATCHER_SCAN_INTERVAL_S": "3600"}  # the SQL door's NOTIFY alone
    async with (
        pooler as pooled_url,
        serve_target(Target()) as target,
        daemon_process({**env, "DISPATCHER_DATABASE_URL": pooled_url}) as d,
    ):
        conn = await asyncpg.connect(pooled_url)
        try:
            await conn.execute(
                "SELECT dispatcher.enqueue('session', 'http', target => $1::jsonb)",
                json.dumps({"url": target.url}),
            )
        finally:
            await conn.close()
        await wait_until(lambda: target.request_keys() == ["session"], what="the delivery")
        await terminate(d)
