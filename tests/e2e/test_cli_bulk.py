"""`dispatcher jobs bulk` as an operator runs it: a real child process on a real database.
Without --yes it shows the dry run and, with nobody to answer, changes nothing; with --yes it
acts and prints what it applied and skipped; a bad option is a usage error naming it; the same
--bulk-key answers again without acting twice."""

from __future__ import annotations

from pathlib import Path

import asyncpg

from tests.e2e.test_cli import seed_jobs
from tests.harness import cli


async def state_of(db_url: str, job_id: int) -> str:
    conn = await asyncpg.connect(db_url)
    try:
        return str(await conn.fetchval("SELECT state FROM dispatcher.jobs WHERE id = $1", job_id))
    finally:
        await conn.close()


async def test_bulk_asks_first_then_acts_and_replays(tmp_path: Path, db_url: str) -> None:
    ids = await seed_jobs(db_url)  # wait: scheduled, now: ready, gone: dead
    env = {"DISPATCHER_DATABASE_URL": db_url}

    asked = await cli("jobs", "bulk", "retry", "--all", cwd=tmp_path, env=env)
    assert asked.code == 1, asked.stderr
    assert "dry run retry: would apply 1 of 3 matching" in asked.stdout
    assert "add --yes to act" in asked.stderr
    assert await state_of(db_url, ids["gone"]) == "dead"  # nobody said yes

    done = await cli(
        "jobs", "bulk", "retry", "--all", "--yes", "--bulk-key", "k1", cwd=tmp_path, env=env
    )
    assert done.code == 0, done.stderr
    assert done.stdout.startswith("retry: applied 1 of 3 (now ready 1); skipped ")
    assert "scheduled 1 (only dead, cancelled or discarded jobs can be retried)" in done.stdout
    assert await state_of(db_url, ids["gone"]) == "ready"

    again = await cli(
        "jobs", "bulk", "retry", "--all", "--yes", "--bulk-key", "k1", cwd=tmp_path, env=env
    )
    assert again.code == 0 and "replayed: nothing more done" in again.stdout

    moved = await cli(
        "jobs", "bulk", "reschedule", "--id", str(ids["wait"]), "--id", str(ids["now"]),
        "--at", "2031-01-01T00:00:00Z", "--yes", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert moved.code == 0, moved.stderr
    assert "applied 2 of 2 (now scheduled 2)" in moved.stdout


async def test_bad_options_are_usage_errors_naming_them(tmp_path: Path, db_url: str) -> None:
    ids = await seed_jobs(db_url)
    env = {"DISPATCHER_DATABASE_URL": db_url}
    for argv, words in [
        (("retry",), "choose the jobs"),
        (("retry", "--priority", "high"), "--priority: an integer from -100 to 100"),
        (("retry", "--queue", "nope", "--yes"), "--queue: unknown queue 'nope'"),
        (("reschedule", "--all", "--yes"), "--at: a reschedule needs"),
        (("cancel", "--all", "--at", "now"), "--at: only a reschedule takes a due time"),
        (("retry", "--error", "ab"), "--error: 3 to 200 characters"),
        (("retry", "--key-prefix", "clé"), "--key-prefix: the start of an idempotency key"),
    ]:
        result = await cli("jobs", "bulk", *argv, cwd=tmp_path, env=env)
        assert (result.code, words in result.stderr) == (2, True), (argv, result.stderr)
    assert await state_of(db_url, ids["gone"]) == "dead"


async def test_the_searches_select_as_the_list_does(tmp_path: Path, db_url: str) -> None:
    ids = await seed_jobs(db_url)
    env = {"DISPATCHER_DATABASE_URL": db_url}
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(
            "UPDATE dispatcher.jobs SET last_error = 'HTTP 410 Gone from hooks' WHERE id = $1",
            ids["gone"],
        )
    finally:
        await conn.close()
    for argv, matching in [
        (("--key-prefix", "go"), 1),
        (("--key-prefix", "g_"), 0),  # _ matches itself
        (("--error", "GONE FROM"), 1),
        (("--error", "gone", "--key-prefix", "now"), 0),
    ]:
        result = await cli("jobs", "bulk", "discard", *argv, cwd=tmp_path, env=env)
        assert result.code == 1, (argv, result.stdout, result.stderr)  # asked, nobody answered
        assert f"of {matching} matching" in result.stdout, (argv, result.stdout)
    assert await state_of(db_url, ids["gone"]) == "dead"  # dry runs only
