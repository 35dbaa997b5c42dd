"""The rough edges a new user met in their first hour (issue 25), each as they met it: the real
`dispatcher` command on a real database, a real pipe closed by its reader, a real daemon over
HTTP, a handler module in the current directory."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from dispatcher.cli import build_parser
from tests.harness import cli, command, free_port, make_settings, running_daemon

pytestmark = pytest.mark.timeout(180)


def nested_commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list:
    """Every command path below a top-level command (`jobs list`, `queues pause`, ...)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                if prefix:
                    found.append((*prefix, name))
                found += nested_commands(child, (*prefix, name))
    return found


POSITIONALS = {
    "show": ["1"],
    "retry": ["1"],
    "cancel": ["1"],
    "run-now": ["1"],
    "reschedule": ["1", "--at", "now"],
    "revoke": ["--all"],
    "trigger": ["nightly", "--period", "2030-01-01T00:00:00Z"],
    "key-limits": ["default", "tenant-a", "--max-inflight", "2"],
    "set": ["default", "--rate-per-s", "5"],
    "reset": ["default"],
    "bulk": ["retry", "--all"],
}


@pytest.mark.parametrize("path", nested_commands(build_parser()), ids=" ".join)
def test_config_is_accepted_after_every_action_as_well_as_before(path: tuple[str, ...]) -> None:
    extra = POSITIONALS.get(path[-1], ["x"] if path[-1] in ("pause", "resume") else [])
    parser = build_parser()
    after = parser.parse_args([*path, *extra, "--config", "after.toml"])
    before = parser.parse_args([path[0], "--config", "before.toml", *path[1:], *extra])
    neither = parser.parse_args([*path, *extra])
    assert (after.config, before.config, neither.config) == ("after.toml", "before.toml", None)


async def seed(db_url: str) -> None:
    """Jobs whose due times print with different precisions (whole seconds, microseconds)."""
    conn = await asyncpg.connect(db_url)
    try:
        for key, due in (
            ("whole", "2030-01-01T00:00:00Z"),
            ("micro", "2030-01-01T00:00:00.123456Z"),
            ("milli", "2030-01-01T00:00:00.5Z"),
        ):
            await conn.execute(
                "SELECT dispatcher.enqueue(key => $1, handler => 'http',"
                ' target => \'{"url": "https://hooks.example.com/x"}\','
                " due_at => $2::text::timestamptz)",
                key,
                due,
            )
    finally:
        await conn.close()


async def test_jobs_list_reads_config_given_after_the_action(tmp_path: Path, db_url: str) -> None:
    await seed(db_url)
    config = tmp_path / "dispatcher.toml"
    config.write_text(f'database_url = "{db_url}"\n')
    result = await cli("jobs", "list", "--json", "--config", str(config), cwd=tmp_path)
    assert result.code == 0, result.stderr
    assert sorted(j["key"] for j in json.loads(result.stdout)) == ["micro", "milli", "whole"]


async def test_jobs_list_columns_line_up_whatever_the_precision(
    tmp_path: Path, db_url: str
) -> None:
    await seed(db_url)
    result = await cli("jobs", "list", cwd=tmp_path, env={"DISPATCHER_DATABASE_URL": db_url})
    assert result.code == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert len(rows) == 3
    assert any(".123456Z" in row for row in rows)  # the precision that used to misalign
    for title in ("STATE", "QUEUE", "ATTEMPT", "DUE", "KEY"):
        column = header.index(title)
        for row in rows:  # every cell starts (or, for ATTEMPT, ends) under its title
            if title == "ATTEMPT":
                end = column + len(title)
                assert row[end - 1] != " " and row[end] == " ", (title, row)
            else:
                assert row[column - 1] == " " and row[column] != " ", (title, header, row)


async def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(
    tmp_path: Path, db_url: str
) -> None:
    """`dispatcher jobs list | head`: the reader is gone before the command writes."""
    await seed(db_url)
    read_end, write_end = os.pipe()
    os.close(read_end)  # as `head` does once it has its lines: every write now fails (EPIPE)
    try:
        proc = await asyncio.create_subprocess_exec(
            *command(),
            "jobs",
            "list",
            cwd=tmp_path,
            env={**os.environ, "DISPATCHER_DATABASE_URL": db_url},
            stdout=write_end,
            stderr=asyncio.subprocess.PIPE,
        )
    finally:
        os.close(write_end)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert err.decode() == ""  # no BrokenPipeError traceback, no "Exception ignored"
    assert proc.returncode == 141  # what POSIX tools report for SIGPIPE (128 + 13)


async def test_a_shell_pipe_into_head_ends_quietly(tmp_path: Path, db_url: str) -> None:
    """More rows than a pipe buffers (64 KiB): the command is still writing when head exits."""
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(
            "SELECT count(*) FROM dispatcher.enqueue_many("
            " (SELECT array_agg('a-key-long-enough-to-fill-the-pipe-' || g)"
            "  FROM generate_series(1, 1000) g),"
            " array_fill('http'::text, ARRAY[1000]), array_fill('{}'::jsonb, ARRAY[1000]),"
            " array_fill(now() + interval '1 hour', ARRAY[1000]),"
            ' targets => array_fill(\'{"url": "https://hooks.example.com/x"}\'::jsonb,'
            " ARRAY[1000]))"
        )
    finally:
        await conn.close()
    script = " ".join(command()) + " jobs list --limit 1000 | head -n 1"
    proc = await asyncio.create_subprocess_shell(
        script,
        cwd=tmp_path,
        env={**os.environ, "DISPATCHER_DATABASE_URL": db_url},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert (proc.returncode, out.decode().split()[0], err.decode()) == (0, "ID", "")


async def test_the_redrive_refusal_names_cli_flags_in_the_cli_and_fields_in_the_api(
    tmp_path: Path, db_url: str
) -> None:
    env = {"DISPATCHER_DATABASE_URL": db_url}
    for verb in ("redrive", "discard"):
        result = await cli("jobs", verb, cwd=tmp_path, env=env)
        assert result.code == 2, result
        line = result.stderr.strip()
        for flag in ("--queue", "--reason", "--tenant", "--since", "--before", "--all"):
            assert flag in line, line
        assert "dead_reason" not in line and '"all"' not in line, line
    crossed = await cli(
        "jobs",
        "redrive",
        "--since",
        "2030-01-02T00:00:00Z",
        "--before",
        "2030-01-01T00:00:00Z",
        cwd=tmp_path,
        env=env,
    )
    assert crossed.stderr.strip() == "dispatcher: --since must be earlier than --before"
    settings = make_settings(db_url)
    async with (
        running_daemon(settings) as daemon,
        aiohttp.ClientSession() as http,
        http.post(daemon.base_url + "/v1/jobs/redrive", json={}) as response,
    ):
        assert response.status == 422
        detail = json.dumps(await response.json())
        assert "dead_reason" in detail and "--reason" not in detail


@pytest.mark.parametrize("own_listener", [False, True], ids=["api-listener", "console-listen"])
async def test_root_and_console_lead_to_the_console(db_url: str, own_listener: bool) -> None:
    console_listen = f"127.0.0.1:{free_port()}" if own_listener else None
    settings = make_settings(
        db_url, api_tokens=["operator-secret-token-0123456789"], console_listen=console_listen
    )
    async with running_daemon(settings) as daemon, aiohttp.ClientSession() as http:
        base = f"http://{console_listen}" if console_listen else daemon.base_url
        for path in ("/", "/console"):  # no token: a redirect protects nothing
            async with http.get(base + path, allow_redirects=False) as response:
                assert (response.status, response.headers["Location"]) == (302, "/console/")
        async with http.get(daemon.base_url + "/v1/jobs") as response:
            assert response.status == 401  # the API itself still asks for a token


HANDLER_CONFIG = '[handlers.welcome]\nkind = "python"\nfunction = "myapp:handle"\n'


async def test_a_handler_in_the_current_directory_names_the_import_path_and_the_fix(
    tmp_path: Path,
) -> None:
    (tmp_path / "myapp.py").write_text("async def handle(job, ctx):\n    return None\n")
    (tmp_path / "dispatcher.toml").write_text(HANDLER_CONFIG)
    refused = await cli("check-config", "--config", "dispatcher.toml", cwd=tmp_path)
    assert refused.code == 2, refused
    line = refused.stderr.strip()
    assert "No module named 'myapp'" in line
    assert f"in the current directory {tmp_path}" in line
    assert f"PYTHONPATH={tmp_path}" in line
    assert re.search(r"Searched: \S*site-packages", line), line
    fixed = await cli(
        "check-config", "--config", "dispatcher.toml", cwd=tmp_path, env={"PYTHONPATH": "."}
    )
    assert fixed.code == 0, fixed.stderr


async def test_a_handler_found_nowhere_or_missing_a_dependency_says_which(
    tmp_path: Path,
) -> None:
    (tmp_path / "dispatcher.toml").write_text(HANDLER_CONFIG)
    nowhere = await cli("check-config", "--config", "dispatcher.toml", cwd=tmp_path)
    assert nowhere.code == 2
    assert "PYTHONPATH=/srv/app" in nowhere.stderr and "pip install" in nowhere.stderr
    (tmp_path / "myapp.py").write_text("import not_installed_anywhere\n")
    broken = await cli(
        "check-config", "--config", "dispatcher.toml", cwd=tmp_path, env={"PYTHONPATH": "."}
    )
    assert broken.code == 2
    assert "myapp imports 'not_installed_anywhere'" in broken.stderr, broken.stderr
