"""The `dispatcher` command as a user runs it: a real child process, configured by the
environment; version, help, check-config, configuration errors and migrate."""

from __future__ import annotations

import json
import os
from pathlib import Path

import asyncpg
import pytest

from dispatcher import __version__
from dispatcher.db import schema
from tests.harness import Result, cli, free_port

# off loopback (check-config's test below), tokens need 32 characters or more
TOKEN_A, TOKEN_B = "tok-alpha-5b1e-6f0a1d33c8e94b27a1c0", "tok-beta-77c2-0d4e9a7f2b3c6e1d8a55"
SECRETS = ("hunter2-db-pass", TOKEN_A, TOKEN_B, "MfKQ9r8GKYqrTwjUPD8ILPZIo2")
SECRET_ENV = {
    "DISPATCHER_DATABASE_URL": "postgresql://app:hunter2-db-pass@db.internal:5432/jobs",
    "DISPATCHER_API_TOKENS": f"{TOKEN_A},{TOKEN_B}",
    "DISPATCHER_HTTP__SIGNING_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
}


def assert_no_secret(result: Result) -> None:
    for secret in SECRETS:
        assert secret not in result.stdout
        assert secret not in result.stderr


async def test_version(tmp_path: Path) -> None:
    result = await cli("--version", cwd=tmp_path)
    assert (result.code, result.stdout.strip()) == (0, f"dispatcher {__version__}")


async def test_help_names_the_commands_and_the_database_choice(tmp_path: Path) -> None:
    result = await cli("--help", cwd=tmp_path)
    assert result.code == 0
    for word in ("run", "migrate", "check-config", "jobs", "DISPATCHER_DATABASE_URL", "--config"):
        assert word in result.stdout
    bare = await cli(cwd=tmp_path)
    assert bare.code == 2  # a command is required
    assert "COMMAND" in bare.stderr


async def test_check_config_prints_the_effective_configuration_with_secrets_masked(
    tmp_path: Path,
) -> None:
    result = await cli(
        "check-config",
        cwd=tmp_path,
        env={
            **SECRET_ENV,
            "DISPATCHER_LISTEN": "0.0.0.0:9000",
            "DISPATCHER_ALLOW_PLAIN_HTTP_TOKENS": "true",
        },
    )
    assert result.code == 0, result.stderr
    view = json.loads(result.stdout)
    assert view["listen"] == "0.0.0.0:9000"
    assert view["database_url"] == "postgresql://app:*****@db.internal:5432/jobs"
    assert len(view["api_tokens"]) == 2
    assert view["drain_timeout_s"] == 30.0
    assert_no_secret(result)


async def test_check_config_reads_the_file_and_env_wins(tmp_path: Path) -> None:
    config = tmp_path / "dispatcher.toml"
    config.write_text(
        'drain_timeout_s = 12\nstate_dir = "/srv/state"\n[queues.default]\nrate_per_s = 5\n'
    )
    env = {"DISPATCHER_QUEUES__DEFAULT__RATE_PER_S": "7"}
    for args, extra in (
        (("check-config", "--config", str(config)), {}),
        (("check-config",), {"DISPATCHER_CONFIG": str(config)}),
    ):
        result = await cli(*args, cwd=tmp_path, env={**env, **extra})
        assert result.code == 0, result.stderr
        view = json.loads(result.stdout)
        assert (view["drain_timeout_s"], view["state_dir"]) == (12.0, "/srv/state")
        assert view["queues"]["default"]["rate_per_s"] == 7.0


@pytest.mark.parametrize("command_name", ["check-config", "run", "migrate"])
async def test_a_bad_value_exits_2_with_one_line(tmp_path: Path, command_name: str) -> None:
    result = await cli(
        command_name, cwd=tmp_path, env={**SECRET_ENV, "DISPATCHER_DRAIN_TIMEOUT_S": "soon"}
    )
    assert result.code == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "dispatcher: configuration error: setting drain_timeout_s = 'soon': Input should be a "
        "valid number, unable to parse string as a number (from env DISPATCHER_DRAIN_TIMEOUT_S)"
    ]
    assert_no_secret(result)


async def test_a_bad_config_changes_nothing(tmp_path: Path, empty_db_url: str) -> None:
    state = tmp_path / "state"
    bad = {"DISPATCHER_STATE_DIR": str(state), "DISPATCHER_SCAN_BATCH": "0"}
    run = await cli("run", cwd=tmp_path, env=bad)
    assert run.code == 2
    assert "setting scan_batch = '0'" in run.stderr
    assert not state.exists()  # no embedded database was created
    assert os.listdir(tmp_path) == []  # nothing at all in the working directory

    migrate = await cli(
        "migrate", cwd=tmp_path, env={**bad, "DISPATCHER_DATABASE_URL": empty_db_url}
    )
    assert migrate.code == 2
    conn = await asyncpg.connect(empty_db_url)
    try:
        assert await conn.fetchval("SELECT to_regnamespace('dispatcher')") is None
    finally:
        await conn.close()


async def test_a_non_loopback_api_without_tokens_refuses_to_start(
    tmp_path: Path, db_url: str
) -> None:
    port = free_port()
    result = await cli(
        "run",
        cwd=tmp_path,
        env={"DISPATCHER_DATABASE_URL": db_url, "DISPATCHER_LISTEN": f"0.0.0.0:{port}"},
    )
    assert result.code == 2
    assert len(result.stderr.splitlines()) == 1
    assert f"listen = '0.0.0.0:{port}' is not loopback" in result.stderr
    assert "DISPATCHER_API_TOKENS" in result.stderr


@pytest.mark.parametrize("command", ["check-config", "run"])
async def test_a_short_token_off_loopback_is_refused(
    tmp_path: Path, db_url: str, command: str
) -> None:
    """Issue 20: a one-character token passed check-config on 0.0.0.0 (and ran)."""
    env = {
        "DISPATCHER_DATABASE_URL": db_url,
        "DISPATCHER_LISTEN": f"0.0.0.0:{free_port()}",
        "DISPATCHER_ALLOW_PLAIN_HTTP_TOKENS": "true",
        "DISPATCHER_API_TOKENS": "k",
    }
    result = await cli(command, cwd=tmp_path, env=env)
    assert result.code == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line == (
        "dispatcher: configuration error: api_tokens[1]: API tokens must be at least 32 "
        "characters when the API or console listens beyond loopback; generate one with: "
        "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
    )


async def migration_rows(url: str) -> list[tuple[int, str]]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT version, name FROM dispatcher.migrations ORDER BY version")
        return [(r["version"], r["name"]) for r in rows]
    finally:
        await conn.close()


async def test_migrate_applies_everything_once_then_is_a_noop(
    tmp_path: Path, empty_db_url: str
) -> None:
    env = {"DISPATCHER_DATABASE_URL": empty_db_url}
    names = [name for _, name, _ in schema.available()]
    names += [f"functions/{name}" for name, _, _ in schema.function_files()]

    first = await cli("migrate", cwd=tmp_path, env=env)
    assert first.code == 0, first.stderr
    assert first.stdout.strip() == "applied: " + ", ".join(names)
    applied = await migration_rows(empty_db_url)
    assert applied == [(version, name) for version, name, _ in schema.available()]

    second = await cli("migrate", cwd=tmp_path, env=env)
    assert second.code == 0, second.stderr
    assert second.stdout.strip() == "schema is current"
    assert await migration_rows(empty_db_url) == applied


async def test_migrate_on_the_current_test_database_twice(tmp_path: Path, db_url: str) -> None:
    before = await migration_rows(db_url)
    for _ in range(2):
        result = await cli("migrate", cwd=tmp_path, env={"DISPATCHER_DATABASE_URL": db_url})
        assert result.code == 0, result.stderr
        assert result.stdout.strip() == "schema is current"
    assert await migration_rows(db_url) == before
    assert not (tmp_path / "var").exists()  # the external database was used


async def test_a_release_older_than_the_database_refuses_to_migrate_or_start(
    tmp_path: Path, db_url: str
) -> None:
    """A newer release migrated this database: `migrate` and the daemon's start (auto_migrate)
    each refuse in one line naming both versions and the fix, and change nothing."""
    newer = schema.latest_version() + 1
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(
            "INSERT INTO dispatcher.migrations (version, name) VALUES ($1, 'newer.sql')", newer
        )
        await conn.execute("UPDATE dispatcher.function_files SET sha256 = 'newer'")
        env = {"DISPATCHER_DATABASE_URL": db_url}
        for args in (("migrate",), ("run",)):
            result = await cli(*args, cwd=tmp_path, env=env)
            assert result.code == 1, (args, result.stdout, result.stderr)
            line = result.stderr.strip().splitlines()[-1]
            assert (
                f"database schema is at version {newer}, newer than this release knows "
                f"({schema.latest_version()}, dispatcher {__version__}): run a dispatcher "
                "release at least as new as the one that migrated it; nothing was changed"
            ) in line, (args, result.stderr)
        # its own function files were not put back over the newer release's
        assert set(
            await conn.fetchval("SELECT array_agg(sha256) FROM dispatcher.function_files")
        ) == {"newer"}
    finally:
        await conn.close()


async def seed_jobs(db_url: str) -> dict[str, int]:
    """Three jobs through the SQL door: one waiting, one ready, one dead."""
    conn = await asyncpg.connect(db_url)
    try:
        target = json.dumps({"url": "https://hooks.example.com/x"})
        ids = {}
        for key, due in (("wait", 3600), ("now", 0), ("gone", 3600)):
            ids[key] = await conn.fetchval(
                "SELECT dispatcher.enqueue($1, 'http', target => $2::jsonb, "
                "due_at => now() + make_interval(secs => $3))",
                key,
                target,
                due,
            )
        await conn.execute(
            "UPDATE dispatcher.jobs SET state = 'dead', dead_reason = 'attempts_exhausted', "
            "finished_at = now() WHERE id = $1",
            ids["gone"],
        )
        return ids
    finally:
        await conn.close()


async def test_status_counts_jobs_per_state_and_says_when_nothing_vacuums(
    tmp_path: Path, db_url: str
) -> None:
    await seed_jobs(db_url)
    env = {"DISPATCHER_DATABASE_URL": db_url}
    result = await cli("status", "--json", cwd=tmp_path, env=env)
    assert result.code == 0, result.stderr
    report = json.loads(result.stdout)
    default = report["queues"]["default"]
    assert {s: default[s] for s in ("scheduled", "ready", "running", "dead")} == {
        "scheduled": 1,
        "ready": 1,
        "running": 0,
        "dead": 1,
    }

    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute("ALTER TABLE dispatcher.job_state SET (autovacuum_enabled = false)")
    finally:
        await conn.close()
    text = await cli("status", cwd=tmp_path, env=env)
    assert text.code == 0, text.stderr
    assert text.stdout.splitlines()[1].split()[:5] == ["default", "1", "1", "0", "0"]
    assert (
        "warning: autovacuum is disabled for dispatcher.job_state: "
        "ALTER TABLE dispatcher.job_state RESET (autovacuum_enabled)"
    ) in text.stderr.splitlines()
    as_json = await cli("status", "--json", cwd=tmp_path, env=env)
    assert any("dispatcher.job_state RESET" in w for w in json.loads(as_json.stdout)["warnings"])


async def test_jobs_commands_list_show_retry_and_cancel(tmp_path: Path, db_url: str) -> None:
    ids = await seed_jobs(db_url)
    env = {"DISPATCHER_DATABASE_URL": db_url}

    dead = await cli("jobs", "list", "--state", "dead", "--json", cwd=tmp_path, env=env)
    assert dead.code == 0, dead.stderr
    assert [j["key"] for j in json.loads(dead.stdout)] == ["gone"]

    shown = await cli("jobs", "show", str(ids["gone"]), "--json", cwd=tmp_path, env=env)
    assert (json.loads(shown.stdout)["state"], json.loads(shown.stdout)["dead_reason"]) == (
        "dead",
        "attempts_exhausted",
    )

    retried = await cli("jobs", "retry", str(ids["gone"]), "--json", cwd=tmp_path, env=env)
    assert retried.code == 0, retried.stderr
    assert json.loads(retried.stdout)["state"] == "ready"

    cancelled = await cli("jobs", "cancel", str(ids["wait"]), cwd=tmp_path, env=env)
    assert cancelled.code == 0, cancelled.stderr
    again = await cli("jobs", "cancel", str(ids["wait"]), cwd=tmp_path, env=env)
    assert again.code == 1
    assert again.stderr.splitlines()[-1] == (
        f"dispatcher: job {ids['wait']} is already cancelled; nothing to cancel"
    )
    missing = await cli("jobs", "show", "999999", cwd=tmp_path, env=env)
    assert (missing.code, missing.stderr.splitlines()[-1]) == (1, "dispatcher: no job 999999")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["list", "--limit", "-5"], "argument --limit: '-5': expected an integer from 1 to 1000"),
        (["list", "--limit", "1001"], "argument --limit: '1001': expected an integer from 1 to"),
        (["show", "99999999999999999999"], "argument id: '99999999999999999999': expected an"),
        (["retry", "abc"], "argument id: 'abc': expected an integer from 1 to"),
    ],
)
async def test_bad_job_arguments_are_usage_errors(
    tmp_path: Path, db_url: str, args: list[str], message: str
) -> None:
    result = await cli("jobs", *args, cwd=tmp_path, env={"DISPATCHER_DATABASE_URL": db_url})
    assert result.code == 2
    assert message in result.stderr.splitlines()[-1]
    assert "Traceback" not in result.stderr
