"""Migration 059: seven single-column checks of the intents live on their columns' domains,
under their old names, so every writer is still checked (the doors, the jobs
view, an operator's SQL on the tables) while a statement no longer re-reads them from the
tables' catalog (docs/performance: "One job per statement"). The upgrade keeps both tables'
storage and every index: no rewrite, no scan, no index built again (the checks of the columns a
partial index names stay on the tables for that reason)."""

from __future__ import annotations

import asyncpg
import pytest

from dispatcher.db import schema

MOVED = {
    # constraint: (table, column, a value it refuses)
    "jobs_key_check": ("intents", "key", "''"),
    "jobs_payload_check": ("intents", "payload", "'[]'::jsonb"),
    "jobs_max_attempts_check": ("intents", "max_attempts", "0"),
    "jobs_max_retry_age_s_check": ("intents", "max_retry_age_s", "-1"),
    "jobs_traceparent_w3c": ("intents", "traceparent", "'not-a-traceparent'"),
    "intents_timeout_s_positive": ("intents", "timeout_s", "'infinity'"),
    "intents_replaced_by_mode": ("intents", "replaced_by", "'sometimes'"),
}
STAYED = {
    "intents_priority_range": "dispatcher.intents",
    "intents_concurrency_key_length": "dispatcher.intents",
    "job_state_state_check": "dispatcher.job_state",
    "job_state_due_at_in_range": "dispatcher.job_state",
    "job_state_expires_at_range": "dispatcher.job_state",
    "job_state_lease_check": "dispatcher.job_state",
}
ENQUEUE = "SELECT dispatcher.enqueue($1, 'noop', '{}'::jsonb, due_at => now() + interval '1 hour')"
# the job tables and their indexes (tests/bench/bench_upgrade.py too): a new file node is a
# rewrite or a rebuild
STORAGE = """
SELECT c.relname, c.relfilenode FROM pg_class c
 WHERE c.oid IN ('dispatcher.intents'::regclass, 'dispatcher.job_state'::regclass)
    OR c.oid IN (SELECT indexrelid FROM pg_index
                  WHERE indrelid IN ('dispatcher.intents'::regclass,
                                     'dispatcher.job_state'::regclass))
"""
CHECKS = """
SELECT conname,
       CASE WHEN conrelid <> 0 THEN conrelid::regclass::text ELSE contypid::regtype::text END
  FROM pg_constraint
 WHERE contype = 'c'
   AND (conrelid IN ('dispatcher.intents'::regclass, 'dispatcher.job_state'::regclass)
        OR contypid IN (SELECT atttypid FROM pg_attribute
                         WHERE attrelid IN ('dispatcher.intents'::regclass,
                                            'dispatcher.job_state'::regclass)
                           AND NOT attisdropped))
"""


async def functions_of_the_version(conn: asyncpg.Connection, version: int) -> None:
    """Today's function and view files, as a full migrate applies them; below the latest
    version, less those that name a column or object a later migration adds (the attempt
    history's view reads 062's columns): a daemon of that version ran with its own files,
    which had no such reader. At the latest version every file must apply."""
    older = version < schema.latest_version()
    for _, sql, _ in schema.function_files():
        try:
            async with conn.transaction():
                await conn.execute(sql)
        except (asyncpg.UndefinedColumnError, asyncpg.UndefinedTableError):
            if not older:
                raise


async def jobs_at_version(conn: asyncpg.Connection, version: int) -> list[int]:
    """The schema migrated up to `version`, with the views and functions it runs with, the
    no-op handler and three scheduled jobs (their ids): the start of a migration's test."""
    await schema.migrate(conn, upto=version)
    await functions_of_the_version(conn, version)
    await conn.execute("INSERT INTO dispatcher.handlers (name, kind) VALUES ('noop', 'python')")
    return [await conn.fetchval(ENQUEUE, f"before-{n}") for n in range(3)]


async def upgrade_to(conn: asyncpg.Connection, version: int) -> list[str]:
    """Migrate up to `version` and put the views and functions back, as a full migrate does;
    the migrations applied."""
    applied = await schema.migrate(conn, upto=version)
    await functions_of_the_version(conn, version)
    return [name for name in applied if not name.startswith("functions/")]


async def test_the_upgrade_keeps_the_tables_and_their_rows_and_moves_every_check(
    empty_db_url: str,
) -> None:
    conn = await asyncpg.connect(empty_db_url)
    try:
        ids = await jobs_at_version(conn, 58)
        storage = dict(await conn.fetch(STORAGE))
        assert await upgrade_to(conn, 59) == ["059_checks_as_domains.sql"]
        assert dict(await conn.fetch(STORAGE)) == storage  # nothing rewritten, no index rebuilt
        kept = await conn.fetch("SELECT id, state FROM dispatcher.jobs ORDER BY id")
        assert [(r["id"], r["state"]) for r in kept] == [(i, "scheduled") for i in ids]
        checks = dict(await conn.fetch(CHECKS))
        # the checks of a column a partial index names stay on the table (its type change
        # would build those indexes again), and so does the two-column one
        assert {name: checks.pop(name) for name in STAYED} == STAYED
        assert set(checks) == set(MOVED)
        assert all(owner.startswith("dispatcher.job_") for owner in checks.values()), checks
        assert await conn.fetchval(ENQUEUE, "after") > ids[-1]  # the door works on the new types
    finally:
        await conn.close()


@pytest.mark.parametrize("constraint", sorted(MOVED))
async def test_every_writer_is_still_checked(conn: asyncpg.Connection, constraint: str) -> None:
    """An UPDATE straight on the table, as an operator's SQL would write it."""
    table, column, bad = MOVED[constraint]
    await conn.execute("INSERT INTO dispatcher.handlers (name, kind) VALUES ('noop', 'python')")
    job_id = await conn.fetchval(ENQUEUE, "checked")
    with pytest.raises(asyncpg.CheckViolationError, match=constraint):
        await conn.execute(f"UPDATE dispatcher.{table} SET {column} = {bad} WHERE id = $1", job_id)


async def test_an_insert_through_the_jobs_view_is_checked(conn: asyncpg.Connection) -> None:
    with pytest.raises(asyncpg.CheckViolationError, match="jobs_payload_check"):
        await conn.execute(
            """INSERT INTO dispatcher.jobs (key, request_hash, queue, handler, payload, state,
                   due_at, max_attempts, max_retry_age_s, budget_started_at)
               VALUES ('v', 'h', 'default', 'noop', '[]', 'ready', now(), 3, 60, now())"""
        )
    assert await conn.fetchval("SELECT count(*) FROM dispatcher.intents") == 0
