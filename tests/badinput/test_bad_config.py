"""Invalid configuration and cron values: each stops `dispatcher` at once with exit code 2 and a
clear one-line-per-problem message naming the setting, and changes nothing in the database."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import asyncpg
import pytest

from tests.harness import free_port

ROOT = Path(__file__).resolve().parents[2]

# (environment, an excerpt the one error line must contain)
BAD_ENV = {
    "negative-rate": (
        {"DISPATCHER_QUEUES__DEFAULT__RATE_PER_S": "-5"},
        "setting queues.default.rate_per_s = '-5': Input should be greater than 0",
    ),
    "pool-of-one": (
        {"DISPATCHER_DB_POOL_SIZE": "1"},
        "setting db_pool_size = '1': Input should be greater than or equal to 2",
    ),
    "connections-below-the-minimum": (
        {"DISPATCHER_DATABASE_MAX_CONNECTIONS": "8"},
        "database_max_connections = 8 is below the 9 connections a daemon needs",
    ),
    "pools-past-the-connection-budget": (
        {"DISPATCHER_DB_POOL_SIZE": "10", "DISPATCHER_HANDLER_POOL_SIZE": "10"},
        "set it to at least 26 (DISPATCHER_DATABASE_MAX_CONNECTIONS), or lower db_pool_size",
    ),
    "lease-not-a-number": ({"DISPATCHER_LEASE_S": "soon"}, "setting lease_s = 'soon'"),
    "listen-without-port": ({"DISPATCHER_LISTEN": "localhost"}, "must be host:port"),
    "tiny-body-limit": ({"DISPATCHER_BODY_LIMIT_BYTES": "10"}, "setting body_limit_bytes = '10'"),
    "misspelt-setting": (
        {"DISPATCHER_QUEUES__DEFAULT__RATE": "5"},
        "setting queues.default.rate: unknown setting; known: rate_per_s",
    ),
    "public-without-tokens": ({"DISPATCHER_LISTEN": "0.0.0.0:8080"}, "API tokens are required"),
    "bad-cidr": ({"DISPATCHER_TARGET_ALLOW_CIDRS": "10.0.0.0/33"}, "setting target_allow_cidrs"),
    "python-handler-without-function": (
        {"DISPATCHER_HANDLERS__X__KIND": "python"},
        'a python handler needs function = "module:function"',
    ),
    "bad-signing-secret": (
        {"DISPATCHER_HTTP__SIGNING_SECRET": "whsec_not base64!"},
        "'whsec_' followed by base64",
    ),
}

SCHEDULE = """
[queues.default]
[handlers.work]
kind = "python"
function = "tests.badinput.handlers:noop"
[[schedules]]
name = "nightly"
handler = "work"
{field}
"""
BAD_SCHEDULES = {
    "minute-61": ('cron = "61 * * * *"', "minute"),
    "four-fields": ('cron = "* * * *"', "has 4 fields"),
    "at-daily": ('cron = "@daily"', "@"),
    "last-day-L": ('cron = "0 0 L * *"', "L"),
    "wrap-around-range": ('cron = "0 22-2 * * *"', "22-2"),
    "never-fires": ('cron = "0 0 31 2 *"', "never"),
    "unknown-timezone": ('cron = "0 3 * * *"\ntimezone = "Mars/Olympus_Mons"', "Mars/Olympus_Mons"),
    "unknown-queue": ('cron = "0 3 * * *"\nqueue = "nowhere"', "queue 'nowhere' is not in"),
}


async def run_cli(args: list[str], env: dict[str, str]) -> tuple[int, list[str]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dispatcher.cli",
        *args,
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, [line for line in err.decode().splitlines() if line.strip()]


def assert_clear_error(code: int, lines: list[str], excerpt: str) -> None:
    assert code == 2, lines
    assert lines and all(line.startswith("dispatcher: configuration error: ") for line in lines), (
        lines
    )
    assert any(excerpt.lower() in line.lower() for line in lines), (excerpt, lines)
    assert not any("Traceback" in line for line in lines), lines


@pytest.mark.parametrize(("env", "excerpt"), BAD_ENV.values(), ids=BAD_ENV.keys())
async def test_bad_setting_is_one_clear_line_and_exit_2(env: dict[str, str], excerpt: str) -> None:
    code, lines = await run_cli(["check-config"], env)
    assert_clear_error(code, lines, excerpt)


@pytest.mark.parametrize(("field", "excerpt"), BAD_SCHEDULES.values(), ids=BAD_SCHEDULES.keys())
async def test_bad_cron_schedule_is_refused_naming_the_schedule(
    tmp_path: Path, field: str, excerpt: str
) -> None:
    config = tmp_path / "dispatcher.toml"
    await asyncio.to_thread(config.write_text, SCHEDULE.format(field=field))
    code, lines = await run_cli(["check-config", "--config", str(config)], {})
    assert_clear_error(code, lines, excerpt)
    assert any("nightly" in line or "schedules" in line for line in lines), lines


async def database_state(db_url: str) -> list[object]:
    conn = await asyncpg.connect(db_url)
    try:
        return [
            [tuple(r) for r in await conn.fetch(f"SELECT * FROM dispatcher.{table} ORDER BY 1")]
            for table in ("queues", "handlers", "jobs", "outbox")
        ]
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("env", "excerpt"),
    [
        ({"DISPATCHER_QUEUES__DEFAULT__MAX_ATTEMPTS": "0"}, "queues.default.max_attempts"),
        (
            {
                "DISPATCHER_HANDLERS__WORK__KIND": "python",
                "DISPATCHER_HANDLERS__WORK__FUNCTION": "no_such_module:run",
            },
            "handlers.work.function",
        ),
    ],
    ids=["bad-queue-limit", "unloadable-handler"],
)
async def test_daemon_refuses_bad_config_without_touching_the_database(
    db_url: str, env: dict[str, str], excerpt: str
) -> None:
    before = await database_state(db_url)
    code, lines = await run_cli(
        ["run"],
        {"DISPATCHER_DATABASE_URL": db_url, "DISPATCHER_LISTEN": f"127.0.0.1:{free_port()}", **env},
    )
    errors = [line for line in lines if not line.startswith("{")]  # JSON log lines aside
    assert code in (1, 2), lines
    assert any(excerpt in line for line in errors), lines
    assert not any("Traceback" in line for line in lines), lines
    assert await database_state(db_url) == before, errors
