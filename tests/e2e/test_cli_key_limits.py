"""`dispatcher queues key-limits NAME KEY` (issue 22 point 4) as a real command on a migrated
database: it stores the key's own limits, `--reset` removes them, and a bad request exits
non-zero saying why, changing nothing."""

from __future__ import annotations

from pathlib import Path

import asyncpg

from tests.harness import cli


async def overrides(db_url: str) -> list[tuple[str, int | None, float | None]]:
    conn = await asyncpg.connect(db_url)
    try:
        rows = await conn.fetch("SELECT key, max_inflight, rate_per_s FROM dispatcher.key_limits")
        return [tuple(r) for r in rows]
    finally:
        await conn.close()


async def test_key_limits_are_set_reset_and_refused(db_url: str, tmp_path: Path) -> None:
    env = {"DISPATCHER_DATABASE_URL": db_url}
    args = ("queues", "key-limits", "default", "acct-7")
    done = await cli(*args, "--max-inflight", "3", "--rate-per-s", "2", cwd=tmp_path, env=env)
    assert done.code == 0, done.stderr
    assert "key acct-7 of queue default: max_inflight 3, rate_per_s 2.0" in done.stdout
    assert await overrides(db_url) == [("acct-7", 3, 2.0)]
    refused = await cli(*args, "--burst", "5", cwd=tmp_path, env=env)
    assert refused.code != 0 and "give rate_per_s too" in refused.stderr, refused.stderr
    assert await overrides(db_url) == [("acct-7", 3, 2.0)]
    reset = await cli(*args, "--reset", cwd=tmp_path, env=env)
    assert reset.code == 0 and "back on the queue's key limits" in reset.stdout, reset.stderr
    assert await overrides(db_url) == []
    missing = await cli(
        "queues", "key-limits", "nope", "k", "--max-inflight", "1", cwd=tmp_path, env=env
    )
    assert missing.code != 0 and "no queue 'nope'" in missing.stderr
